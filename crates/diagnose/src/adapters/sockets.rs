//! Layer 4: a `lagtrace_sockets` inspection → [`SocketEvidence`] for the server on `port`.

use lagtrace_sockets::serving::Dest;
use lagtrace_sockets::{Inspection, SocketInfo};

use crate::evidence::{ClientSide, ConfigDirective, OptionCount, ServerProcess, SocketEvidence};

/// Directives of the config lens that matter for latency.
const DIRECTIVES: [&str; 6] = [
    "tcp_nodelay",
    "tcp_nopush",
    "sendfile",
    "keepalive_timeout",
    "keepalive_requests",
    "postpone_output",
];

/// The server listening on `port` in the inspected namespace, its established sockets'
/// options, and its configuration. `None` when nothing listens on `port` there.
/// The listener is the one that serves `dest` ([`lagtrace_sockets::serving`], the rule the
/// host layer follows too): a second listener on the port at another address is not the
/// server, and the connections it accepted are not counted.
pub fn evidence(ins: &Inspection, dest: Dest, port: u16, netns: &str) -> Option<SocketEvidence> {
    let listeners: Vec<&SocketInfo> = ins.sockets.iter().filter(|s| s.state == "LISTEN").collect();
    let serving = lagtrace_sockets::serving::serving(&listeners, |s| s.local, port, dest);
    serving.first()?;
    // nginx: the master and its workers share the listener; the master has the lowest pid.
    // Under SO_REUSEPORT each worker may hold a listener of its own: all of them count.
    let mut owners: Vec<&lagtrace_sockets::Owner> =
        serving.iter().flat_map(|l| l.owners.iter()).collect();
    owners.sort_by_key(|o| o.pid);
    owners.dedup_by_key(|o| o.pid);
    let owner_pids: Vec<u32> = owners.iter().map(|o| o.pid).collect();
    let main = owners.first().copied();
    // A connection is the server's when the listener serving its local address is.
    let ours = |s: &SocketInfo| {
        lagtrace_sockets::serving::serving(&listeners, |l| l.local, port, Dest::To(s.local.ip()))
            .iter()
            .any(|l| serving.iter().any(|m| std::ptr::eq(**l, **m)))
    };
    let mut ev = SocketEvidence {
        client: ClientSide::default(),
        server: main.map(|o| ServerProcess {
            pid: o.pid,
            comm: o.comm.clone(),
            netns: netns.into(),
        }),
        ..SocketEvidence::default()
    };
    if owners.is_empty() {
        ev.notes.push(format!(
            "the listener on :{port} has no visible owner process (another pid namespace, or \
             no permission to read /proc/*/fd)"
        ));
    }
    let mut nodelay = OptionCount::default();
    let mut cork = OptionCount::default();
    let mut established = 0;
    let mut first_err = None;
    // A connection the dump listed whose owner the descriptor scan after it did not find,
    // while the listener's owners were read: it closed in between (a server that closes
    // keep-alive connections after N requests churns them under load; 7 of 32 in one run),
    // so it is no socket of the server's to judge.
    let closed = |s: &&SocketInfo| !owners.is_empty() && s.owners.is_empty() && s.options.is_none();
    let mut gone = 0;
    for s in ins
        .sockets
        .iter()
        .filter(|s| s.state == "ESTABLISHED" && s.local.port() == port && ours(s))
    {
        if closed(&s) {
            gone += 1;
            continue;
        }
        established += 1;
        match &s.options {
            Some(o) => {
                match o.nodelay {
                    Some(true) => nodelay.on += 1,
                    Some(false) => nodelay.off += 1,
                    None => nodelay.unknown += 1,
                }
                match o.cork {
                    Some(true) => cork.on += 1,
                    Some(false) => cork.off += 1,
                    None => cork.unknown += 1,
                }
            }
            None => {
                nodelay.unknown += 1;
                cork.unknown += 1;
                if first_err.is_none() {
                    first_err = s.options_error.clone();
                }
            }
        }
    }
    if gone > 0 {
        ev.notes.push(format!(
            "{gone} connections closed between the socket dump and the descriptor scan \
             (no owner found): not counted"
        ));
    }
    ev.established = established;
    ev.nodelay = nodelay;
    ev.cork = cork;
    if let Some(e) = first_err {
        ev.notes.push(format!(
            "options unread on {} sockets: {e}",
            nodelay.unknown
        ));
    }
    if established == 0 {
        ev.notes.push(format!(
            "no established connection on :{port} at inspection time: options not read"
        ));
    }
    // Configuration: for each directive, the most specific scope that covers the port.
    for d in DIRECTIVES {
        let mut cands: Vec<_> = ins
            .configs
            .iter()
            .filter(|c| c.directive == d && owner_pids.contains(&c.pid))
            .filter(|c| c.ports.is_empty() || c.ports.contains(&port))
            .collect();
        // Server/location scopes (with ports) before the http scope; explicit before default.
        cands.sort_by_key(|c| {
            (
                c.ports.is_empty(),
                c.default,
                c.server.starts_with("server"),
            )
        });
        if let Some(c) = cands.first() {
            ev.config.push(ConfigDirective {
                name: c.directive.clone(),
                value: c.value.clone(),
                file: c
                    .file
                    .as_ref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_else(|| "(default)".into()),
                line: c.line.unwrap_or(0),
                default: c.default,
            });
        }
    }
    ev.notes.extend(
        ins.notes
            .iter()
            .filter(|n| owner_pids.iter().any(|p| n.contains(&p.to_string())))
            .take(3)
            .cloned(),
    );
    Some(ev)
}
