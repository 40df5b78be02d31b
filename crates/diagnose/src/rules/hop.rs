//! The hops behind the server. Each hop is judged with the same rules as the server (its
//! own packets, its peer's sockets, and the client's view of the run); a cause the hop's
//! packets show becomes the verdict's when the server's own verdict sees only time spent
//! inside the server (`slow-server`, `unexplained-tail`, or nothing at all), and
//! `verdict.hop` says where on the chain it sits.
//!
//! Pure functions of the evidence; [`super::judge`] runs the rules on each hop.

use lagtrace_model::Cause;
use lagtrace_model::diagnosis::evidence::{HopEvidence, ServerProcess};

use super::{Judgement, ms};
use crate::evidence::{Layer, LayerName, Layers, Target};
use crate::verdict::{EvidenceLine, Fix, FixSide, Hop, HopNode, Mechanism, Stance};
use lagtrace_model::FindingKind;

/// Whether the server's own verdict leaves its time unexplained: only then can a hop behind
/// it take the verdict. That is the server's time itself (`slow-server`, a tail no layer
/// explains, or nothing at all), or a cause the server's own packets did not show although
/// they were captured (its sockets and the run's shape alone: a proxy whose upstream sockets
/// have Nagle on, while the Nagle stalls are on the hop behind it). A cause the server's
/// packets show (its Nagle, a lossy path to the client, its listen queue) stays the server's.
pub(super) fn front_open(front: &Judgement, layers: &Layers) -> bool {
    matches!(
        front.verdict.cause,
        Cause::SlowServer | Cause::Healthy | Cause::UnexplainedTail
    ) || (layers.packets.get().is_some_and(|p| p.transactions > 0)
        && !front.finding_layers.contains(&LayerName::Packets))
        // A response's end held until the client's ACK, seen in the packets alone (the
        // server's sockets do not show Nagle on): a proxy that streams forwards the head at
        // once and the body when its upstream sends it, and an upstream's stall that ends
        // near the client's delayed ACK reads on the front as the proxy's own Nagle (Apache
        // mod_proxy in front of a backend with Nagle on).
        || (front.verdict.cause == Cause::NagleDelayedAck
            && !front.finding_layers.contains(&LayerName::Sockets))
}

/// Whether the hop's judgement accounts for the front's: a front that named a cause from
/// its own packets (`front_open`'s packets-only Nagle) yields only to a hop whose cause
/// adds at least half as much per request; one that saw only the server's time yields to
/// any hop that names a cause.
pub(super) fn explains(front: &Judgement, hop: &Judgement) -> bool {
    matches!(
        front.verdict.cause,
        Cause::SlowServer | Cause::Healthy | Cause::UnexplainedTail
    ) || hop.verdict.cost.added_us.saturating_mul(2) >= front.verdict.cost.added_us
}

/// The hop's layers: its packets and its peer's sockets, with the client's app runs (what
/// the requests waited: the hop's delay is in them) and no path or host of its own.
pub(super) fn hop_layers(front: &Layers, h: &HopEvidence) -> Layers {
    // The hop's client is the server's process, not lagtrace: say so where the sockets
    // layer speaks of the client.
    let mut sockets = h.sockets.clone();
    if let Some(s) = sockets.data.as_mut() {
        s.client.note = format!(
            "the client on this hop is {}: the server's own connections to {}",
            who(&h.from),
            h.peer
        );
    }
    Layers {
        path: Layer::skipped("a hop behind the server: its path is inside the server's host"),
        app: front.app.clone(),
        packets: h.packets.clone(),
        sockets,
        host: Layer::skipped("a hop behind the server: the host layer is the server's"),
        hops: Vec::new(),
    }
}

/// The hop as a target of its own (the peer's address and port).
pub(super) fn hop_target(h: &HopEvidence) -> Target {
    let (addr, port) = match h.peer.parse::<std::net::SocketAddr>() {
        Ok(sa) => (sa.ip().to_string(), sa.port()),
        Err(_) => (h.peer.clone(), 0),
    };
    Target {
        url: format!("tcp://{}", h.peer),
        host: addr.clone(),
        addr,
        port,
    }
}

/// Whether a hop's judgement names a cause of its own, seen in the hop's own packets (the
/// app layer alone is the client's view through the server, not the hop's), whose fix is on
/// the hop's far side. A cause fixed on the hop's client side (its receive window, its
/// delayed ACKs) is the connecting server's own: a server too busy to read its upstream's
/// responses fills its receive window, and that is the server's time, which its own verdict
/// already names.
pub(super) fn names_cause(j: &Judgement) -> bool {
    !matches!(
        j.verdict.cause,
        Cause::Healthy | Cause::Unreachable | Cause::Partial | Cause::UnexplainedTail
    ) && j.finding_layers.contains(&LayerName::Packets)
        && j.verdict
            .fix
            .first()
            .is_some_and(|f| f.side != FixSide::Client)
}

/// A hop whose peer's listener overflowed: the connecting server's SYNs were dropped, or —
/// the accept queue full when the handshake's last ACK came — its first request went on a
/// connection the peer never completed and was sent again (the same drop, read in the
/// packets as loss). Where the peer's own drop count (`sk_drops`, raised on every accept
/// queue overflow) covers at least half of the hop's resent SYNs and segments, the hop's
/// `syn-drop` or `packet-loss` is the listener's: `syn-drop` with mechanism
/// `accept-queue-overflow`, its backlog in the fix. A lossy path with a drop or two at the
/// listener stays `packet-loss`.
pub(super) fn listener_overflow(j: &mut Judgement, h: &HopEvidence) {
    let (Some(l), Some(p)) = (h.listener.as_ref(), h.packets.get()) else {
        return;
    };
    if !matches!(j.verdict.cause, Cause::SynDrop | Cause::PacketLoss) {
        return;
    }
    let count = |k: FindingKind| p.finding(k).map_or(0, |f| f.count);
    let (syns, segments) = (
        count(FindingKind::SynRetransmit),
        count(FindingKind::Retransmission),
    );
    let drops = l.drops.unwrap_or(0);
    if drops == 0 || drops * 2 < syns + segments {
        return;
    }
    j.verdict.cause = Cause::SynDrop;
    j.verdict.mechanism = Some(Mechanism::AcceptQueueOverflow);
    // The resends the listener explains are its evidence, no longer a lossy path's.
    for e in &mut j.evidence {
        if e.cause == Some(Cause::PacketLoss) && e.stance == Stance::Supports {
            e.cause = Some(Cause::SynDrop);
        }
    }
    j.verdict
        .secondary
        .retain(|c| *c != Cause::PacketLoss && *c != Cause::SynDrop);
    j.evidence.insert(
        0,
        EvidenceLine {
            layer: LayerName::Host,
            stance: Stance::Supports,
            cause: Some(Cause::SynDrop),
            text: format!(
                "the peer's listener {} (accept queue limit {}, peak {} in {} samples, full in \
                 {}) dropped {drops} connection attempts during the run (its own count, \
                 sk_drops): enough for the hop's {syns} resent SYNs and {segments} resent \
                 segments (a request sent on a handshake the full queue never completed is \
                 sent again)",
                l.local, l.max, l.peak, l.samples, l.full_samples
            ),
        },
    );
    let backlog = Fix {
        side: FixSide::Server,
        location: Some(l.local.clone()),
        change: format!(
            "the accept queue of {} (limit {}) overflows: raise the peer's listen backlog and \
             net.core.somaxconn, and accept faster (more workers)",
            l.local, l.max
        ),
        tradeoff: None,
    };
    j.verdict.fix.retain(|f| f.side != FixSide::Path);
    j.verdict.fix.insert(0, backlog);
    if !j.finding_layers.contains(&LayerName::Host) {
        j.finding_layers.push(LayerName::Host);
    }
}

/// What a hop's cause costs the requests, to pick between hops: the median added × share.
pub(super) fn impact(j: &Judgement) -> f64 {
    j.verdict.cost.added_us as f64 * j.verdict.cost.share
}

/// How many connections the client-facing run kept open (its concurrency), at least 1.
fn front_connections(front: &Judgement) -> u32 {
    front.verdict.cost.concurrency.unwrap_or(1).max(1)
}

/// Keep the hop's connections open instead of one per request, in the connecting server's
/// terms where it is known.
fn reuse_fix(h: &HopEvidence) -> crate::verdict::Fix {
    let change = if h.from.comm == "nginx" {
        format!(
            "keep upstream connections to {} open: `upstream NAME {{ server {}; keepalive 32; }}` \
             with `proxy_http_version 1.1;` and `proxy_set_header Connection \"\";` in the \
             location (nginx opens a connection per request otherwise)",
            h.peer, h.peer
        )
    } else {
        format!(
            "reuse connections to {} (a keep-alive pool) instead of opening one per request",
            h.peer
        )
    };
    crate::verdict::Fix {
        side: FixSide::Server,
        location: Some(format!("{}, its connections to {}", who(&h.from), h.peer)),
        change,
        tradeoff: Some("idle connections held open to the upstream".into()),
    }
}

/// A process in words: `nginx (pid 7)`, or its name alone where the evidence has no pid
/// (0: a saved capture's).
pub(super) fn who(p: &ServerProcess) -> String {
    if p.pid == 0 {
        p.comm.clone()
    } else {
        format!("{} (pid {})", p.comm, p.pid)
    }
}

/// The chain's first node: the user's client.
fn client_node() -> HopNode {
    HopNode {
        name: "client".into(),
        pid: None,
        addr: None,
    }
}

/// A process on the chain; pid 0 is one the evidence could not name (a saved capture's).
fn node(p: &ServerProcess, addr: Option<String>) -> HopNode {
    HopNode {
        name: p.comm.clone(),
        pid: (p.pid != 0).then_some(p.pid),
        addr,
    }
}

/// How many hops deep a verdict follows the request (the watch follows as deep).
pub(super) const MAX_DEPTH: u32 = 8;

/// The process at the far end of a hop: its listener's owner, else the service its port is
/// known for, else `local` (a loopback peer no process was found for: a saved capture's)
/// or `remote`.
fn peer_node(h: &HopEvidence) -> HopNode {
    let on_loopback = h
        .peer
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback());
    match &h.to {
        Some(p) => node(p, Some(h.peer.clone())),
        None => HopNode {
            name: h
                .service
                .clone()
                .unwrap_or_else(|| String::from(if on_loopback { "local" } else { "remote" })),
            pid: None,
            addr: Some(h.peer.clone()),
        },
    }
}

/// The chain client → server → each hop's peer on `path` (the server's hop first), with the
/// last one marked.
pub(super) fn chain(target: &Target, path: &[&HopEvidence]) -> Hop {
    // The process that opened the first hop's connections (a worker, where the listener's
    // owner is a master that does not serve).
    let mut nodes = vec![
        client_node(),
        node(
            &path[0].from,
            Some(format!("{}:{}", target.addr, target.port)),
        ),
    ];
    nodes.extend(path.iter().map(|h| peer_node(h)));
    let at = nodes.len() - 1;
    Hop::new(nodes, at)
}

/// The chain client → server → a process on this host the server waited on (found by its
/// wake-ups, no address known), the last one marked; `server` unnamed when its sockets were
/// not read.
pub(super) fn to_process(
    target: &Target,
    server: Option<&ServerProcess>,
    comm: &str,
    pid: u32,
) -> Hop {
    let at = Some(format!("{}:{}", target.addr, target.port));
    let server = match server {
        Some(p) => node(p, at),
        None => HopNode {
            name: "server".into(),
            pid: None,
            addr: at,
        },
    };
    let peer = ServerProcess {
        pid,
        comm: comm.into(),
        netns: String::new(),
    };
    Hop::new(vec![client_node(), server, node(&peer, None)], 2)
}

/// The verdict of the hop, placed: its cause, cost and fix, `verdict.hop`, its evidence
/// marked with the hop, then the server's own lines (what it saw of the wait).
pub(super) fn adopt(front: Judgement, mut hop: Judgement, h: &HopEvidence, at: Hop) -> Judgement {
    let peer = at.chain[at.at].label();
    // A fix on the hop's server side is the peer's; on its client side, the process that
    // opened the connections (its upstream sockets, not the user's client).
    let client = format!(
        "{}, its connections to {}",
        at.chain[at.at - 1].label(),
        h.peer
    );
    for f in &mut hop.verdict.fix {
        let whose = match f.side {
            FixSide::Client => &client,
            _ => &peer,
        };
        f.location = Some(match f.location.take() {
            None => whose.clone(),
            Some(l) if l.contains(&h.peer) => l,
            Some(l) => format!("{whose}: {l}"),
        });
    }
    // Connection setup on the hop: the server opens a connection per request (many seen)
    // and the peer's listener drops some — reusing connections removes the setup itself.
    // Connections to the peer: the streams its capture saw (every one), else those the
    // socket watch saw.
    let conns = h
        .packets
        .get()
        .map_or(0, |p| p.streams)
        .max(u64::from(h.connections));
    if hop.verdict.cause == Cause::SynDrop && conns >= 2 * u64::from(front_connections(&front)) {
        hop.verdict.fix.insert(0, reuse_fix(h));
    }
    hop.verdict.summary = format!("{} — on the hop to {peer}", hop.verdict.summary);
    let mut evidence: Vec<EvidenceLine> = vec![EvidenceLine {
        layer: LayerName::Packets,
        stance: Stance::Supports,
        cause: Some(hop.verdict.cause),
        text: format!(
            "the request's way: {}; {}'s {} connection(s) to {} were captured on its side",
            at.text,
            who(&h.from),
            h.connections,
            h.peer
        ),
    }];
    evidence.extend(hop.evidence.into_iter().map(|mut e| {
        if e.layer == LayerName::Sockets && e.text.starts_with("client (lagtrace)") {
            // On the hop the client is the server's process, not lagtrace.
            e.text = format!(
                "the client on this hop is {}, the server's own connections to {}",
                who(&h.from),
                h.peer
            );
        }
        if matches!(e.layer, LayerName::Packets | LayerName::Sockets) {
            e.text = format!("hop {}: {}", h.peer, e.text);
        }
        e
    }));
    // What the server's side showed: its time is the hop's wait.
    evidence.extend(
        front
            .evidence
            .into_iter()
            .filter(|e| e.stance != Stance::Supports || e.cause == Some(Cause::SlowServer))
            .map(|mut e| {
                if e.cause == Some(Cause::SlowServer) && e.stance == Stance::Supports {
                    e.stance = Stance::Note;
                    e.text = format!("at the server: {}", e.text);
                }
                e
            }),
    );
    let mut finding_layers = hop.finding_layers;
    finding_layers.extend(front.finding_layers);
    finding_layers.sort();
    finding_layers.dedup();
    let mut j = Judgement {
        verdict: hop.verdict,
        evidence,
        finding_layers,
    };
    if is_remote(h) {
        upstream_wait(&mut j, h, &at);
    }
    j.verdict.hop = Some(at);
    j
}

/// The server's tail placed on the hop `h` it waited on: no rule names a cause in the hop's
/// own packets (a rare stall is far beyond the hop's p99, and its distributions hide it),
/// but the upstream join shows, request by request, that the slowest requests' server time
/// was their wait on the exchanges they caused there (`added_us` over the typical request's,
/// `requests` of them joined). The time is the hop's own: `slow-server` at its peer, with
/// the server's lines kept as what it saw of the wait, and the fix on the peer (on another
/// host: `upstream-wait`, an agent there says why).
pub(super) fn tail_on(
    front: Judgement,
    h: &HopEvidence,
    at: Hop,
    added_us: u64,
    requests: usize,
) -> Judgement {
    let peer = at.chain[at.at].label();
    let mut j = front;
    let mechanism = j.verdict.mechanism;
    j.verdict.cause = Cause::SlowServer;
    j.verdict.summary = format!(
        "{} — the slowest requests wait on the hop to {peer}",
        super::rule(Cause::SlowServer).map_or("", |r| r.summary())
    );
    if let Some(t) = j.verdict.tail.as_mut() {
        for p in t
            .parts
            .iter_mut()
            .filter(|p| p.cause == Cause::UnexplainedTail)
        {
            p.cause = Cause::SlowServer;
        }
    }
    for e in &mut j.evidence {
        if e.stance == Stance::Supports {
            e.stance = Stance::Note;
            e.text = format!("at the server: {}", e.text);
        }
    }
    let pattern = match mechanism {
        Some(m) => format!(" ({} at {peer})", m.name()),
        None => String::new(),
    };
    j.evidence.insert(
        0,
        EvidenceLine {
            layer: LayerName::Packets,
            stance: Stance::Supports,
            cause: Some(Cause::SlowServer),
            text: format!(
                "the request's way: {}; the slowest requests' server time was their wait on \
                 the hop to {}: +{} over the typical request's{pattern}, on the exchanges \
                 they caused there ({requests} of them matched to one by timestamps) — the \
                 time is {peer}'s, not {}'s",
                at.text,
                h.peer,
                ms(added_us),
                who(&h.from)
            ),
        },
    );
    j.verdict.fix = vec![Fix {
        side: FixSide::Server,
        location: Some(peer.clone()),
        change: format!(
            "{peer} answers most of {}'s requests at once but some after +{}: find what the \
             slow ones do there (a slow path, a lock, a pause, its own backends) with \
             per-request timings in its logs or a profiler; `lagtrace diagnose` pointed at \
             {} looks at it directly",
            who(&h.from),
            ms(added_us),
            h.peer
        ),
        tradeoff: None,
    }];
    if !j.finding_layers.contains(&LayerName::Packets) {
        j.finding_layers.push(LayerName::Packets);
        j.finding_layers.sort();
    }
    if is_remote(h) {
        upstream_wait(&mut j, h, &at);
    }
    j.verdict.hop = Some(at);
    j
}

/// Whether lagtrace cannot look inside the hop's peer: no process of this host listens
/// there (its sockets could not be read) and it is not a loopback address.
pub(super) fn is_remote(h: &HopEvidence) -> bool {
    h.to.is_none()
        && h.sockets.get().is_none()
        && h.peer
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| !a.ip().is_loopback())
}

/// The fix for a server whose time is its wait on `peer`, an upstream lagtrace cannot look
/// inside from here: the time is spent there (or on the way), and an agent there says why.
pub(super) fn upstream_wait_fix(from: &str, peer: &str, each_us: u64, location: String) -> Fix {
    Fix {
        side: FixSide::Server,
        location: Some(location),
        change: format!(
            "{from} waits ~{} per request for {peer} to answer, on another host lagtrace cannot \
             look inside from here: run `lagtrace agent` on that host and `lagtrace diagnose \
             --agent` against it (or `lagtrace diagnose` there) to see where its time goes — \
             its handler, its own upstreams, its host; meanwhile cache its answers or call it \
             less often (one call per request, in parallel, with a timeout)",
            ms(each_us)
        ),
        tradeoff: None,
    }
}

/// A hop to an upstream on another host whose own time is the wait (`slow-server` seen in
/// the hop's packets, no mechanism): `upstream-wait` — the packets show the upstream took
/// the time, and only an agent on its host can say how.
fn upstream_wait(j: &mut Judgement, h: &HopEvidence, at: &Hop) {
    if j.verdict.cause != Cause::SlowServer || j.verdict.mechanism.is_some() {
        return;
    }
    j.verdict.mechanism = Some(Mechanism::UpstreamWait);
    if let Some(t) = j.verdict.tail.as_mut() {
        for p in t.parts.iter_mut().filter(|p| p.cause == Cause::SlowServer) {
            p.mechanism.get_or_insert(Mechanism::UpstreamWait);
        }
    }
    let each = h
        .packets
        .get()
        .and_then(|p| p.server_time.as_ref())
        .map_or(j.verdict.cost.added_us, |s| s.p50_us);
    let f = &at.chain[at.at - 1];
    let from = match f.pid {
        Some(pid) => format!("{} (pid {pid})", f.name),
        None => f.name.clone(),
    };
    let peer = at.chain[at.at].label();
    // The rule's own fix ("profile the handler") reads as if lagtrace saw inside the peer.
    j.verdict
        .fix
        .retain(|f| !(f.side == FixSide::Server && f.change.contains("profile the handler")));
    j.verdict
        .fix
        .insert(0, upstream_wait_fix(&from, &h.peer, each, peer));
}

/// Requests a per-request own time needs behind it.
const JOIN_LEAST: u64 = 20;

/// The server's own time with its wait on the first hop taken out — a proxy that only
/// passes requests on spends well under a millisecond of its own. Per request where the
/// hop's exchanges were matched to the requests that caused them (`first.join`): the p50 of
/// each request's server time less its wait on its upstreams. Else its server time at the
/// client-facing capture less the first hop's exchange (its request's first byte to its
/// response's last byte, at the server's side of the hop), p50 of each.
pub(super) fn own_time(j: &mut Judgement, layers: &Layers, first: &HopEvidence) {
    // Only from a join that matched most of the hop's exchanges (a capture that began late
    // or stopped at its cap would speak for a few requests).
    if let Some(hj) = first
        .join
        .as_ref()
        .filter(|h| h.downstream >= JOIN_LEAST && h.joined * 2 >= h.exchanges)
        && let (Some(own), Some(wait), Some(hop)) =
            (hj.own.as_ref(), hj.wait.as_ref(), j.verdict.hop.as_mut())
    {
        hop.server_own_us = Some(own.p50_us);
        j.evidence.push(EvidenceLine {
            layer: LayerName::Packets,
            stance: Stance::Note,
            cause: None,
            text: format!(
                "{}'s own time ~{} per request (p50; p99 {}): each request's server time \
                 less its wait on the exchanges it caused on the hop to {} (p50 {}, p99 {}); \
                 {} of the hop's {} exchanges matched to the {} requests that caused them, \
                 by timestamps",
                who(&first.from),
                ms(own.p50_us),
                ms(own.p99_us),
                first.peer,
                ms(wait.p50_us),
                ms(wait.p99_us),
                hj.joined,
                hj.exchanges,
                hj.downstream
            ),
        });
        return;
    }
    let server = layers
        .packets
        .get()
        .and_then(|p| p.server_time.as_ref())
        .map(|p| p.p50_us);
    let exchange = first
        .packets
        .get()
        .and_then(|p| p.exchange_time.as_ref())
        .map(|p| p.p50_us);
    let (Some(s), Some(e), Some(hop)) = (server, exchange, j.verdict.hop.as_mut()) else {
        return;
    };
    let own = s.saturating_sub(e);
    hop.server_own_us = Some(own);
    j.evidence.push(EvidenceLine {
        layer: LayerName::Packets,
        stance: Stance::Note,
        cause: None,
        text: format!(
            "{}'s own time ~{} per request: its server time p50 {} at the client-facing \
             capture, less its wait on the hop to {} (request to the response's last byte, p50 \
             {})",
            who(&first.from),
            ms(own),
            ms(s),
            first.peer,
            ms(e)
        ),
    });
}
