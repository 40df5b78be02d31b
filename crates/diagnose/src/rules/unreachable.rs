//! `unreachable`: no request succeeded and no connection could be made. Decided before any
//! other cause, from what the path layer saw: RST (nothing listens), silence (nothing
//! answers), or a TLS handshake that fails on a port that accepts TCP — unless the server's
//! host shows why its listener answers no one: a SYN flood filling its SYN queue with
//! syncookies off is `syn-drop` / `syn-flood` (the server is there; real clients' SYNs are
//! dropped), not an address or a route to check.

use lagtrace_model::Cause;

use super::facts::{Facts, Flood};
use super::{Judgement, ms, sup};
use crate::evidence::{LayerName, LayerStatus, Layers, PathEvidence, Target};
use crate::verdict::{Confidence, Cost, EvidenceLine, Fix, FixSide, Mechanism, Verdict};

const CAUSE: Cause = Cause::Unreachable;

/// Connection attempts that failed in the application's runs.
fn connect_errors(layers: &Layers) -> u64 {
    layers
        .app
        .get()
        .map(|a| {
            [a.c1.as_ref(), a.cn.as_ref()]
                .into_iter()
                .flatten()
                .map(|r| r.errors.connect)
                .sum()
        })
        .unwrap_or(0)
}

/// Connects of the application's runs that waited for a SYN retransmission (or timed out).
fn syn_waits(layers: &Layers) -> u64 {
    layers
        .app
        .get()
        .map(|a| {
            [a.c1.as_ref(), a.cn.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|r| r.connects.as_ref())
                .map(|c| c.syn_retransmitted)
                .sum()
        })
        .unwrap_or(0)
}

/// TCP connects but the TLS handshake fails (the app layer's reason says so).
fn tls_fails(layers: &Layers) -> bool {
    layers
        .app
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("TLS"))
}

/// The http:// URL the load gave when the server answered in plain HTTP, not TLS.
fn plain_http_url(layers: &Layers) -> Option<String> {
    let r = layers.app.reason.as_deref()?;
    r.contains("answers in plain HTTP, not TLS")
        .then(|| r.rsplit("use ").next().map(|u| u.trim().to_string()))
        .flatten()
        .filter(|u| u.starts_with("http://"))
}

fn fix(side: FixSide, location: String, change: String) -> Fix {
    Fix {
        side,
        location: Some(location),
        change,
        tradeoff: None,
    }
}

/// Where the connection stops: (path evidence, summary, fix).
fn where_it_stops(
    target: &Target,
    layers: &Layers,
    x: &Facts<'_>,
) -> (Option<EvidenceLine>, String, Fix) {
    let where_ = format!("{}:{}", target.addr, target.port);
    match x.path {
        Some(p) if p.reached && !p.port_open => {
            let rst = p.idle.as_ref().map(|s| s.rst).unwrap_or(0);
            let line = sup(
                LayerName::Path,
                CAUSE,
                format!(
                    "the host answers ({} RST to {} SYN probes, RTT {}): nothing listens on \
                     port {}",
                    rst,
                    p.idle.as_ref().map(|s| s.sent).unwrap_or(0),
                    ms(x.rtt_us),
                    target.port
                ),
            );
            let change = format!(
                "start the server on port {}, or use the port it listens on",
                target.port
            );
            (
                Some(line),
                format!("nothing listens on {where_}: the host answers with RST"),
                fix(FixSide::Server, where_, change),
            )
        }
        Some(p) if !p.reached => (
            Some(silence_line(p, &where_)),
            format!("{} does not answer: no SYN-ACK, no RST", target.addr),
            fix(
                FixSide::Path,
                target.addr.clone(),
                "check the address, the route to it and firewalls that drop SYNs silently".into(),
            ),
        ),
        // An https URL to a server that answered our plain request in HTTP: the scheme is
        // the fix (load tried one plain request after the handshake failed).
        _ if plain_http_url(layers).is_some() => {
            let url = plain_http_url(layers).unwrap_or_default();
            (
                None,
                format!("{where_} speaks plain HTTP, not TLS: no request over https could be sent"),
                fix(FixSide::Client, target.url.clone(), format!("use {url}")),
            )
        }
        // TCP connects (the SYN probes are answered), the TLS handshake does not.
        _ if tls_fails(layers) => (
            None,
            format!(
                "{where_} accepts TCP connections but the TLS handshake fails: no request \
                     could be sent"
            ),
            fix(
                FixSide::Client,
                target.url.clone(),
                "if the server speaks plain HTTP on this port, use http://; if its \
                     certificate is self-signed, add --insecure"
                    .into(),
            ),
        ),
        _ => (
            None,
            format!("no connection to {where_} could be made"),
            fix(
                FixSide::Server,
                where_,
                "check that the server runs and listens on this address".into(),
            ),
        ),
    }
}

/// No reply to the SYN probes, and where the route stops.
fn silence_line(p: &PathEvidence, where_: &str) -> EvidenceLine {
    let sent = p.idle.as_ref().map(|s| s.sent).unwrap_or(0);
    let mut t = format!("no reply to {sent} SYN probes to {where_}");
    if let Some(last) = p.hops.iter().rev().find(|h| h.addr.is_some()) {
        t.push_str(&format!(
            "; the route stops after hop {} ({})",
            last.ttl,
            last.addr.as_deref().unwrap_or("?")
        ));
    }
    sup(LayerName::Path, CAUSE, t)
}

/// The hops that answered.
fn route_line(p: &PathEvidence) -> EvidenceLine {
    let answered: Vec<String> = p
        .hops
        .iter()
        .filter_map(|h| h.addr.as_ref().map(|a| format!("hop {} {a}", h.ttl)))
        .collect();
    sup(
        LayerName::Path,
        CAUSE,
        if answered.is_empty() {
            format!(
                "route: no hop answered up to TTL {} (the address is on a directly \
                 connected link, or every router is silent)",
                p.hops.len()
            )
        } else {
            format!("route: {}; nothing beyond", answered.join(", "))
        },
    )
}

/// The `unreachable` judgement, when no request completed and no connection was made.
pub(super) fn judge(target: &Target, layers: &Layers, x: &Facts<'_>) -> Option<Judgement> {
    if x.c1.is_some() || x.cn.is_some() {
        return None;
    }
    let connect_errors = connect_errors(layers);
    let path_says_closed = x.path.is_some_and(|p| !p.port_open);
    let tls = tls_fails(layers);
    if connect_errors == 0 && !path_says_closed && !tls {
        return None;
    }
    // The SYN probes got SYN-ACKs while the load's connects waited for retransmissions or
    // timed out: the server is there and sets up connections too slowly (`syn-drop`).
    // `unreachable` needs no connection at all *and* probes that are not answered.
    if x.path.is_some_and(|p| p.port_open) && !tls && syn_waits(layers) > 0 {
        return None;
    }
    if let Some(f) = x.flood(target.port).filter(|f| f.dropped > 0) {
        return Some(flooded(layers, x, &f, connect_errors));
    }
    let (path_line, summary, fix) = where_it_stops(target, layers, x);
    let mut ev: Vec<EvidenceLine> = path_line.into_iter().collect();
    if connect_errors > 0 {
        let why = layers
            .app
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        ev.push(sup(
            LayerName::App,
            CAUSE,
            format!("{connect_errors} connection attempt(s) failed, no request completed{why}"),
        ));
    }
    if let Some(p) = x.path.filter(|p| !p.hops.is_empty()) {
        ev.push(route_line(p));
    }
    Some(Judgement {
        verdict: Verdict {
            cause: CAUSE,
            secondary: Vec::new(),
            confidence: if x.path.is_some() && connect_errors > 0 {
                Confidence::High
            } else {
                Confidence::Medium
            },
            summary: summary.clone(),
            cost: Cost {
                share: 1.0,
                affected: (connect_errors > 0).then_some(connect_errors),
                of: (connect_errors > 0).then_some(connect_errors),
                text: format!("every request fails: {summary}"),
                ..Cost::default()
            },
            mechanism: None,
            tail: None,
            fix: vec![fix],
            hop: None,
        },
        evidence: ev,
        finding_layers: [LayerName::Path, LayerName::App]
            .into_iter()
            .filter(|l| layers.status(*l) != LayerStatus::Unavailable)
            .collect(),
    })
}

/// No connection could be made because a SYN flood fills the listener's SYN queue with
/// syncookies off: `syn-drop` / `syn-flood`, every connect lost to it.
fn flooded(layers: &Layers, x: &Facts<'_>, f: &Flood<'_>, connect_errors: u64) -> Judgement {
    const SYN: Cause = Cause::SynDrop;
    let mut ev = vec![sup(
        LayerName::Host,
        SYN,
        f.line("while no connection could be made: every real client's SYN meets the full queue"),
    )];
    if let Some(p) = x.path.and_then(|p| p.idle.as_ref()) {
        ev.push(sup(
            LayerName::Path,
            SYN,
            format!(
                "{} of {} SYN probes answered: the full queue drops them like the clients' \
                 SYNs",
                p.received, p.sent
            ),
        ));
    }
    if connect_errors > 0 {
        ev.push(sup(
            LayerName::App,
            SYN,
            format!("{connect_errors} connection attempt(s) failed, no request completed"),
        ));
    }
    let summary =
        "a SYN flood fills the listener's SYN queue: real clients' SYNs are dropped".to_string();
    Judgement {
        verdict: Verdict {
            cause: SYN,
            secondary: Vec::new(),
            confidence: Confidence::High,
            summary: summary.clone(),
            cost: Cost {
                share: 1.0,
                affected: (connect_errors > 0).then_some(connect_errors),
                of: (connect_errors > 0).then_some(connect_errors),
                text: format!("every connect fails: {summary}"),
                ..Cost::default()
            },
            mechanism: Some(Mechanism::SynFlood),
            tail: None,
            fix: vec![f.fix()],
            hop: None,
        },
        evidence: ev,
        finding_layers: [LayerName::Host, LayerName::Path, LayerName::App]
            .into_iter()
            .filter(|l| layers.status(*l) != LayerStatus::Unavailable)
            .collect(),
    }
}
