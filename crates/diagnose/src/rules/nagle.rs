//! `nagle-delayed-ack`: the server's Nagle algorithm holds the end of a response until the
//! client's delayed ACK (~40 ms). Shown directly by the packets' Nagle/delayed-ACK finding,
//! corroborated by TCP_NODELAY off on the server's sockets (or `tcp_nodelay off;`) and by
//! the application's 40 ms shape (first request on a connection fast, later ones slow).

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{
    Candidate, CauseRule, MATERIAL_ADDED_US, MATERIAL_SHARE, finding_text, has, material, ms, note,
    out, pct, sup,
};
use crate::evidence::{LayerName, OptionCount, Route, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

pub(super) struct Nagle;

const CAUSE: Cause = Cause::NagleDelayedAck;

/// What the sockets and the server's configuration say: (lines, whether they show it).
fn sockets_say(x: &Facts<'_>) -> (Vec<EvidenceLine>, bool) {
    let mut ev = Vec::new();
    let mut says = false;
    let Some(s) = x.sockets else {
        return (ev, says);
    };
    if s.nodelay.off > 0 && s.nodelay.off >= s.nodelay.on {
        let who = s
            .server
            .as_ref()
            .map(|p| format!("{} (pid {})", p.comm, p.pid))
            .unwrap_or_else(|| "the server".into());
        ev.push(sup(
            LayerName::Sockets,
            CAUSE,
            format!(
                "{who}: TCP_NODELAY off on {}/{} established sockets",
                s.nodelay.off,
                s.nodelay.on + s.nodelay.off + s.nodelay.unknown
            ),
        ));
        says = true;
    }
    if let Some(d) = s.directive("tcp_nodelay").filter(|d| d.value == "off") {
        ev.push(sup(
            LayerName::Sockets,
            CAUSE,
            format!("{}:{}: tcp_nodelay {};", d.file, d.line, d.value),
        ));
        says = true;
    }
    if x.passive {
        ev.push(note(
            LayerName::Sockets,
            "clients: real clients (passive), not lagtrace; their delayed ACKs are the \
             packets' own"
                .into(),
        ));
    } else if !s.client.quickack {
        ev.push(note(
            LayerName::Sockets,
            "client (lagtrace): TCP_NODELAY on, delayed ACK on (no TCP_QUICKACK), \
             like wrk and browsers"
                .into(),
        ));
    }
    (ev, says)
}

/// Whether every server socket read has TCP_NODELAY on (and all could be read): direct
/// evidence that Nagle holds nothing on them, whatever a capture's timing suggests.
fn nodelay_on_everywhere(x: &Facts<'_>) -> bool {
    x.sockets
        .is_some_and(|s| s.nodelay.on > 0 && s.nodelay.off == 0 && s.nodelay.unknown == 0)
}

/// The application's 40 ms shape at c=1: (line, the later requests' extra latency over the
/// first when the first request on a connection is fast).
fn app_shape(x: &Facts<'_>) -> Option<(EvidenceLine, Option<u64>)> {
    let c1 = x.c1?;
    let p50 = c1.latency.p50_us;
    if !(30_000..=60_000).contains(&p50) {
        return None;
    }
    let mut t = format!(
        "c=1 p50 {} over a path RTT of {}: the ~40 ms delayed-ACK timer",
        ms(p50),
        ms(x.rtt_us)
    );
    let mut shape_added = None;
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
    Some((sup(LayerName::App, CAUSE, t), shape_added))
}

impl CauseRule for Nagle {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        // Direct evidence wins: with TCP_NODELAY read on every server socket, a stall the
        // packets attribute to Nagle is something else (see `rule_out`).
        if nodelay_on_everywhere(x) {
            return None;
        }
        let mut ev = Vec::new();
        let mut layers = Vec::new();
        let mut direct = false;
        let mut added = 0;
        let mut share = 0.0;
        let mut counted = None;
        // Packets: the combined finding, else its halves.
        let pk = [
            FindingKind::NagleDelayedAck,
            FindingKind::NagleStall,
            FindingKind::DelayedAck,
        ]
        .into_iter()
        .filter_map(|k| x.finding(k))
        .find(|f| material(f, MATERIAL_SHARE));
        if let Some(f) = pk {
            ev.push(sup(
                LayerName::Packets,
                CAUSE,
                finding_text(f, x.transactions()),
            ));
            layers.push(LayerName::Packets);
            direct = true;
            added = f.median_added_us;
            share = f.share;
            counted = Some((f.transactions, Some(x.transactions())));
        }
        // Sockets and config: corroborate; alone they only make a low-confidence candidate
        // when the application latency has the 40 ms shape.
        let (sock_ev, sockets_say) = sockets_say(x);
        ev.extend(sock_ev);
        if sockets_say {
            layers.push(LayerName::Sockets);
        }
        let app = app_shape(x);
        let app_says = app.is_some();
        let shape_added = app.as_ref().and_then(|a| a.1);
        if let Some((l, _)) = app {
            ev.push(l);
            layers.push(LayerName::App);
        }
        if !direct {
            if sockets_say && app_says {
                added = x.c1.map(|r| r.latency.p50_us.saturating_sub(x.rtt_us))?;
                share = 1.0;
                direct = true; // the socket option is direct evidence of the mechanism
            } else if let Some(a) = shape_added.filter(|_| app_says) {
                // Only the application's shape: a slow server would make the first request
                // on a connection slow too; ~40 ms on every later one is the delayed-ACK
                // timer.
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
        let mut c = Candidate::new(CAUSE, added, share, layers);
        c.direct = direct;
        c.counted = counted;
        c.evidence = ev;
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        let mut v = Vec::new();
        if has(chosen, CAUSE) {
            return v;
        }
        if let Some(p) = x.packets {
            // Nagle holds seen in the packets that stay short (a large response's tail waits
            // one ACK round trip, not the delayed-ACK timer) are named, not hidden.
            let short = [FindingKind::NagleDelayedAck, FindingKind::NagleStall]
                .into_iter()
                .filter_map(|k| p.finding(k))
                .filter(|f| f.share >= MATERIAL_SHARE && f.median_added_us < MATERIAL_ADDED_US)
                .max_by(|a, b| a.share.total_cmp(&b.share));
            v.push(out(
                LayerName::Packets,
                CAUSE,
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
        if let Some(s) = x.sockets {
            if s.nodelay.on > 0 && s.nodelay.off == 0 {
                v.push(out(
                    LayerName::Sockets,
                    CAUSE,
                    format!(
                        "server sockets: TCP_NODELAY set on {}/{}",
                        s.nodelay.on,
                        s.nodelay.on + s.nodelay.unknown
                    ),
                ));
            }
            let seen = [
                FindingKind::NagleDelayedAck,
                FindingKind::NagleStall,
                FindingKind::DelayedAck,
            ]
            .into_iter()
            .filter_map(|k| x.finding(k))
            .find(|f| material(f, MATERIAL_SHARE));
            if let Some(f) = seen.filter(|_| nodelay_on_everywhere(x)) {
                v.push(note(
                    LayerName::Sockets,
                    format!(
                        "the packets show {} on {} of transactions, but every server socket \
                         read has TCP_NODELAY on: Nagle holds nothing there (a segment that \
                         leaves only with the next ACK was held before the wire, or the \
                         receiver was late)",
                        f.kind,
                        pct(f.share)
                    ),
                ));
            }
            if s.nodelay.off > 0 && x.packets.is_some() {
                v.push(note(
                    LayerName::Sockets,
                    format!(
                        "server sockets: TCP_NODELAY off on {}/{}, but no material Nagle \
                         stall in the packets (each response leaves in one write, or a hold \
                         lasts only until an ACK within a round trip)",
                        s.nodelay.off,
                        s.nodelay.on + s.nodelay.off + s.nodelay.unknown
                    ),
                ));
            }
        }
        v
    }

    fn summary(&self) -> &'static str {
        "the server's Nagle algorithm holds the end of each response until the client's \
         delayed ACK (~40 ms); neither side is slow"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        Cost {
            p50_without_us: Some(p50_without(c, x)),
            ..c.cost(x, cost_text(c, x))
        }
    }

    fn fixes(&self, _c: &Candidate, x: &Facts<'_>, target: &Target) -> Vec<Fix> {
        let mut v = server_fixes(x);
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
            change: route_quickack(&target.addr, x.path.and_then(|p| p.route.as_ref())),
            tradeoff: Some(
                "every connection on that route ACKs at once: more ACK packets, needs \
                 root on every client"
                    .into(),
            ),
        });
        v
    }
}

/// The server side: the config line when it is known, else the socket option.
fn server_fixes(x: &Facts<'_>) -> Vec<Fix> {
    let d = x
        .sockets
        .and_then(|s| s.directive("tcp_nodelay"))
        .filter(|d| d.value == "off");
    if let Some(d) = d {
        return vec![
            Fix {
                side: FixSide::Server,
                location: Some(format!("{}:{}", d.file, d.line)),
                change: "tcp_nodelay off; → tcp_nodelay on; then reload nginx".into(),
                tradeoff: None,
            },
            Fix {
                side: FixSide::Server,
                location: Some(d.file.clone()),
                change: "or sendfile off; or tcp_nopush on; (the response then leaves in \
                         full frames)"
                    .into(),
                tradeoff: Some("tcp_nopush delays the last partial frame slightly".into()),
            },
        ];
    }
    vec![Fix {
        side: FixSide::Server,
        location: None,
        change: format!(
            "{}: set it (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, 1)), or write each response \
             in one call (one buffer or writev)",
            nodelay_said(&x.server_name(), x.sockets.map(|s| &s.nodelay))
        ),
        tradeoff: None,
    }]
}

/// What the server's sockets said about TCP_NODELAY, in one clause: off where it was read,
/// some unreadable, or none read (and what reading them takes: `pidfd_getfd` on another
/// process's descriptor needs CAP_SYS_PTRACE, entering its network namespace CAP_SYS_ADMIN).
fn nodelay_said(server: &str, nodelay: Option<&OptionCount>) -> String {
    match nodelay {
        Some(n) if n.off > 0 => {
            let read = n.on + n.off + n.unknown;
            if n.off == read {
                format!("{server} sets no TCP_NODELAY on its sockets (off on all {read} read)")
            } else {
                format!(
                    "{server} sets no TCP_NODELAY on {} of its {read} sockets read",
                    n.off
                )
            }
        }
        Some(n) if n.unknown > 0 => format!(
            "{server} may not set TCP_NODELAY on its sockets ({} of {} could not be read)",
            n.unknown,
            n.on + n.unknown
        ),
        Some(n) if n.on > 0 => format!(
            "{server} sets TCP_NODELAY on the {} sockets read, and may not on others",
            n.on
        ),
        Some(_) => format!(
            "{server} most likely does not set TCP_NODELAY on its sockets (none was found \
             established to read)"
        ),
        None => format!(
            "{server} most likely does not set TCP_NODELAY on its sockets (they were not \
             read: run lagtrace on the server's host as root, or with CAP_SYS_PTRACE and, for \
             a server in another network namespace, CAP_SYS_ADMIN, to read them)"
        ),
    }
}

/// The command that turns quick ACKs on for the client's route to `addr`: a host route with
/// the next hop `ip route get` showed on the client (`route`), which narrows the change to
/// the server and can be run again (`replace`). Without the route (real clients' traffic, a
/// capture), how to find its pieces, then the command.
fn route_quickack(addr: &str, route: Option<&Route>) -> String {
    let ip = match addr.parse::<std::net::IpAddr>() {
        // Loopback traffic follows the local table's route, not a main-table one: give the
        // exact command.
        Ok(std::net::IpAddr::V4(a)) if a.is_loopback() => {
            return "ip route change local 127.0.0.0/8 dev lo table local proto kernel \
                    scope host src 127.0.0.1 quickack 1"
                .into();
        }
        Ok(ip) => ip,
        Err(_) => {
            return format!(
                "run `ip route get ADDRESS` with the server's address ({addr}), then `ip route \
                 replace ADDRESS/32` (/128 for IPv6, with `ip -6`) followed by the via, dev \
                 and src words it printed and `quickack 1`"
            );
        }
    };
    let (ip_cmd, len) = if ip.is_ipv6() {
        ("ip -6", 128)
    } else {
        ("ip", 32)
    };
    match route.filter(|r| r.kind == "unicast") {
        Some(r) => {
            let mut c = format!("{ip_cmd} route replace {ip}/{len}");
            if let Some(gw) = &r.via {
                c.push_str(&format!(" via {gw}"));
            }
            c.push_str(&format!(" dev {}", r.dev));
            if let Some(src) = &r.src {
                c.push_str(&format!(" src {src}"));
            }
            if let Some(t) = &r.table {
                c.push_str(&format!(" table {t}"));
            }
            c.push_str(" quickack 1");
            c
        }
        // The server's address is the client host's own: its route is in the local table.
        None if route.is_some_and(|r| r.kind == "local") => format!(
            "run `{ip_cmd} route show table local {ip}`, then `{ip_cmd} route change` followed \
             by the route it printed, `table local` and `quickack 1`"
        ),
        None => format!(
            "run `{ip_cmd} route get {ip}` on the client, then `{ip_cmd} route replace \
             {ip}/{len}` followed by the via, dev and src words it printed and `quickack 1`"
        ),
    }
}

/// The p50 without the hold: the first request on a connection (spared by quick-ACK mode),
/// else the p50 less the hold, at least the path RTT.
fn p50_without(c: &Candidate, x: &Facts<'_>) -> u64 {
    let p50 = x.main_run().map(|r| r.latency.p50_us).unwrap_or(0);
    x.c1.and_then(|r| r.first_request.as_ref())
        .map(|f| f.p50_us)
        .unwrap_or_else(|| p50.saturating_sub(c.added_us).max(x.rtt_us))
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    let run = x.main_run();
    let p50 = run.map(|r| r.latency.p50_us).unwrap_or(0);
    let conc = run.map_or_else(|| "c=1".to_string(), |r| r.label());
    let without = p50_without(c, x);
    format!(
        "adds ~{} to {} of requests (those after the first on each connection); p50 {} \
         at {} would be ~{} without it",
        ms(c.added_us),
        pct(c.share),
        ms(p50),
        conc,
        ms(without)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(on: u32, off: u32, unknown: u32) -> OptionCount {
        OptionCount { on, off, unknown }
    }

    /// Issue 34 item 8: each reading of the server's TCP_NODELAY is one correct sentence
    /// (it was "nginx most likely sets no (its sockets were not read) TCP_NODELAY on its
    /// sockets").
    #[test]
    fn what_the_sockets_said_about_tcp_nodelay_reads_as_a_sentence() {
        let n = "nginx (pid 7)";
        assert_eq!(
            nodelay_said(n, Some(&count(0, 32, 0))),
            "nginx (pid 7) sets no TCP_NODELAY on its sockets (off on all 32 read)"
        );
        assert_eq!(
            nodelay_said(n, Some(&count(2, 30, 0))),
            "nginx (pid 7) sets no TCP_NODELAY on 30 of its 32 sockets read"
        );
        assert_eq!(
            nodelay_said(n, Some(&count(0, 0, 5))),
            "nginx (pid 7) may not set TCP_NODELAY on its sockets (5 of 5 could not be read)"
        );
        assert_eq!(
            nodelay_said(n, Some(&count(27, 0, 5))),
            "nginx (pid 7) may not set TCP_NODELAY on its sockets (5 of 32 could not be read)"
        );
        assert_eq!(
            nodelay_said("the server process", None),
            "the server process most likely does not set TCP_NODELAY on its sockets (they \
             were not read: run lagtrace on the server's host as root, or with \
             CAP_SYS_PTRACE and, for a server in another network namespace, CAP_SYS_ADMIN, \
             to read them)"
        );
        assert_eq!(
            nodelay_said(n, Some(&count(0, 0, 0))),
            "nginx (pid 7) most likely does not set TCP_NODELAY on its sockets (none was \
             found established to read)"
        );
    }

    fn route(via: Option<&str>, dev: &str, src: Option<&str>) -> Route {
        Route {
            kind: "unicast".into(),
            dev: dev.into(),
            via: via.map(Into::into),
            src: src.map(Into::into),
            table: None,
        }
    }

    /// Issue 34 item 8: with the client's route known, the route fix is a command to paste
    /// (a host route with the same next hop), never a placeholder.
    #[test]
    fn the_quickack_route_fix_is_a_command_to_paste() {
        let r = route(Some("10.0.0.1"), "eth0", Some("10.0.0.5"));
        assert_eq!(
            route_quickack("10.1.0.2", Some(&r)),
            "ip route replace 10.1.0.2/32 via 10.0.0.1 dev eth0 src 10.0.0.5 quickack 1"
        );
        let r = route(None, "veth-a", Some("10.9.0.1"));
        assert_eq!(
            route_quickack("10.9.0.2", Some(&r)),
            "ip route replace 10.9.0.2/32 dev veth-a src 10.9.0.1 quickack 1"
        );
        let mut r = route(Some("fd00:1::2"), "v0l", Some("fd00:1::1"));
        r.table = Some("100".into());
        assert_eq!(
            route_quickack("fd00:3::2", Some(&r)),
            "ip -6 route replace fd00:3::2/128 via fd00:1::2 dev v0l src fd00:1::1 table 100 \
             quickack 1"
        );
        // Loopback: the local table's exact route, whatever `ip route get` said.
        let lo = Route {
            kind: "local".into(),
            ..route(None, "lo", Some("127.0.0.1"))
        };
        assert!(
            route_quickack("127.0.0.1", Some(&lo)).starts_with("ip route change local 127.0.0.0/8")
        );
        // Unknown route: an instruction, no placeholder.
        for (addr, route) in [
            ("10.9.0.2", None),
            ("10.0.0.5", Some(&lo)),
            ("fd00::2", None),
        ] {
            let c = route_quickack(addr, route);
            assert!(c.starts_with("run `ip"), "{c}");
            assert!(c.contains("quickack 1") && !c.contains('<'), "{c}");
        }
    }
}
