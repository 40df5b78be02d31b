//! The hops behind the server: the TCP connections its processes open (connect, not
//! accept) while the load runs, their packets, and the process at the other end.
//!
//! - **Found** from the server's own sockets, never from a port: every process holding the
//!   target's listener (as the host layer finds them) is watched through the run; each of
//!   its TCP sockets whose local port is not the listener's is an upstream connection, and
//!   its peer address:port is a hop. Polled (sock_diag + the processes' descriptor tables)
//!   from before the c=1 run, so a proxy that opens a connection per request is seen too.
//! - **Captured** in the server's namespace on the interface toward each peer (loopback
//!   included), one capture per peer: each connection is seen at
//!   one capture point, and the client-facing capture is left as it was.
//! - **Analysed** with the same TCP analysis as the server's own traffic (the connecting
//!   process is the client there), and the peer's sockets and configuration are read where
//!   the peer listens on this host.
//!
//! The verdict rules then judge each hop with the same rules ([`crate::rules::judge`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lagtrace_host::listen::ListenTrack;
use lagtrace_model::diagnosis::evidence::{HopEvidence, ServerProcess};
use lagtrace_model::host::ListenerQueue;
use lagtrace_netns::NetNs;

use crate::evidence::{AppRun, Layer, PacketEvidence};
use crate::run::ServerLocation;

/// How often the server processes' descriptor tables are read for new sockets. A
/// connection that lives less than this may be missed on one poll, not on every request of
/// a run.
const POLL: Duration = Duration::from_millis(100);
/// At most one sock_diag dump (the new sockets' addresses) per this interval, none during the
/// c=N run once one has run (a dump every 500 ms showed as "process-wide pauses every
/// 517 ms" in a healthy server's p99.9: suite run at ddd6b2c). Measured before: a
/// dump of the whole established hash every 50 ms cost 11 % of a core and raised a healthy
/// nginx's c=32 p99.9 from ~5 ms to ~10 ms.
const DUMP_EVERY: Duration = Duration::from_millis(500);
/// Before the c=N run, while no peer has been found and the processes keep opening sockets
/// not seen before, a dump per poll: a proxy that opens a short connection per request
/// holds each for a few ms, and at one dump every 500 ms the c=1 run found none on 2
/// diagnoses in 5 (nginx without upstream keep-alive). A server that opens nothing shows
/// no new socket after its client's connections are known, and dumps no more.
const SEARCH_EVERY: Duration = POLL;
/// How often the processes holding the listener are looked up again (workers come and go).
/// The lookup reads every process's descriptor table on the machine: rare, never per poll.
const PIDS_EVERY: Duration = Duration::from_secs(5);
/// sock_diag states of a connection its process still holds: SYN_SENT, ESTABLISHED,
/// FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK, CLOSING.
const OPEN_STATES: u32 =
    (1 << 1) | (1 << 2) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11);
/// At most this many peers are followed (the busiest by connections seen).
const MAX_HOPS: usize = 8;
/// Packets kept per hop capture: the whole run, as the front's (the hop's findings cover
/// it; its timings for the upstream join stay the first `max_transactions`).
const MAX_HOP_PACKETS: u64 = crate::run::MAX_RUN_PACKETS;

/// A peer seen from the server's sockets (or, deeper, from a hop's).
#[derive(Debug, Clone)]
struct Seen {
    from: ServerProcess,
    local_ports: BTreeSet<u16>,
    /// 1 for the server's own upstreams, 2 for theirs, …
    depth: u32,
    /// The hop whose listener's processes opened these connections (none at depth 1).
    via: Option<SocketAddr>,
}

/// How deep the watch follows: the server's upstreams, theirs, and theirs (three hops:
/// proxy → proxy → proxy → application).
const MAX_DEPTH: u32 = 3;

/// One listener whose processes are watched for the connections they open.
struct Watched {
    port: u16,
    /// Which of the listeners on `port` ([`crate::run::Dest`]).
    dest: crate::run::Dest,
    depth: u32,
    /// The hop this listener is the far end of (none for the server itself).
    via: Option<SocketAddr>,
    pids: Vec<u32>,
    pids_at: Option<Instant>,
}

type SeenMap = BTreeMap<SocketAddr, Seen>;

/// Watches the server's processes for the connections they open.
pub struct Discovery {
    netns: NetNs,
    location: ServerLocation,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<SeenMap>>,
    late: Arc<Mutex<Late>>,
    /// The namespace's listeners over the run, once the watch has stopped.
    listeners: Arc<Mutex<Vec<ListenerQueue>>>,
    thread: Option<JoinHandle<()>>,
}

/// The captures the watch starts itself, for peers first seen once capturing began.
struct Late {
    /// Capturing has begun (the c=N run).
    on: bool,
    /// Peers whose capture was started (or tried).
    started: BTreeSet<SocketAddr>,
    caps: HopCaptures,
}

/// The hop captures of one run.
pub struct HopCaptures {
    running: Vec<RunningHopCapture>,
    /// Peers seen only after the captures started (not captured), with their notes.
    not_captured: Vec<(SocketAddr, String)>,
}

struct RunningHopCapture {
    handle: lagtrace_packet::capture::CaptureHandle,
    file: crate::run::TempPath,
    point: String,
    peer: SocketAddr,
}

impl HopCaptures {
    /// How many peers are captured.
    pub fn peers(&self) -> usize {
        self.running.len()
    }

    /// The captured peers, comma-separated.
    pub fn peer_list(&self) -> String {
        self.running
            .iter()
            .map(|c| c.peer.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Discovery {
    /// Starts watching the processes holding `target`'s listener where the server runs on
    /// this machine; `None` elsewhere (a remote server: its agent would have to say).
    pub fn start(loc: &ServerLocation, dest: crate::run::Dest, port: u16) -> Option<Discovery> {
        let (netns, label) = match loc {
            ServerLocation::Here => (NetNs::Current, "current".to_string()),
            ServerLocation::Namespace(n) => (NetNs::Named(n.clone()), n.clone()),
            _ => return None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<SeenMap>> = Arc::default();
        let late = Arc::new(Mutex::new(Late {
            on: false,
            started: BTreeSet::new(),
            caps: HopCaptures {
                running: Vec::new(),
                not_captured: Vec::new(),
            },
        }));
        let listeners: Arc<Mutex<Vec<ListenerQueue>>> = Arc::default();
        let thread = {
            let (netns, stop, seen, late, listeners) = (
                netns.clone(),
                stop.clone(),
                seen.clone(),
                late.clone(),
                listeners.clone(),
            );
            std::thread::Builder::new()
                .name("hops".into())
                .spawn(move || {
                    let mut track = ListenTrack::new(None);
                    watch(
                        &netns,
                        &label,
                        (dest, port),
                        &stop,
                        &seen,
                        &late,
                        &mut track,
                    );
                    *listeners.lock().unwrap_or_else(|e| e.into_inner()) =
                        track.finish(&BTreeMap::new());
                })
                .ok()?
        };
        Some(Discovery {
            netns,
            location: loc.clone(),
            stop,
            seen,
            late,
            listeners,
            thread: Some(thread),
        })
    }

    /// Whether any peer has been seen so far.
    pub fn any_seen(&self) -> bool {
        !self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    fn snapshot(&self) -> SeenMap {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts one capture per peer seen so far, on the interface toward it; a peer first
    /// seen from now on gets its capture when the watch sees it (a proxy that opens a short
    /// connection per request may show none in c=1).
    pub fn start_captures(&self) -> HopCaptures {
        let mut caps = HopCaptures {
            running: Vec::new(),
            not_captured: Vec::new(),
        };
        // The watch locks `seen` then `late`: take the snapshot before locking `late`.
        let peers = busiest(&self.snapshot());
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        for peer in peers {
            match capture_peer(&self.netns, peer) {
                Ok(c) => caps.running.push(c),
                Err(e) => caps.not_captured.push((peer, e)),
            }
            late.started.insert(peer);
        }
        late.on = true;
        caps
    }

    /// Stops watching and capturing; each hop with its packets and its peer's sockets, and
    /// (`timed`) each captured hop's timed exchanges, for the upstream join.
    pub fn finish(
        mut self,
        caps: HopCaptures,
        timed: bool,
    ) -> (Vec<HopEvidence>, Vec<Option<crate::run::Timings>>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let seen = self.snapshot();
        let listeners =
            std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|e| e.into_inner()));
        let mut caps = caps;
        {
            let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
            caps.running.append(&mut late.caps.running);
            caps.not_captured.append(&mut late.caps.not_captured);
        }
        let mut packets: BTreeMap<SocketAddr, Layer<PacketEvidence>> = BTreeMap::new();
        let mut timings: BTreeMap<SocketAddr, crate::run::Timings> = BTreeMap::new();
        for c in caps.running {
            let layer = match c.handle.stop() {
                Ok(stats) => {
                    let (layer, t) = crate::run::analyse_timed(
                        &c.file.0,
                        c.point,
                        stats.dropped_by_kernel,
                        &AppRun::default(),
                        timed,
                    );
                    if let Some(t) = t {
                        timings.insert(c.peer, t);
                    }
                    layer
                }
                Err(e) => Layer::error(format!("capture: {e:#}")),
            };
            packets.insert(c.peer, layer);
        }
        for (p, why) in caps.not_captured {
            packets.insert(p, Layer::error(why));
        }
        let mut hops = Vec::new();
        let mut hop_timings = Vec::new();
        for peer in busiest(&seen) {
            hop_timings.push(timings.remove(&peer));
            let s = &seen[&peer];
            let packets = packets.remove(&peer).unwrap_or_else(|| {
                Layer::skipped("not captured: more peers than are followed at once")
            });
            let local = is_local(peer.ip(), &self.netns);
            let sockets = if local {
                crate::run::inspect_server(
                    &self.location,
                    crate::run::Dest::To(peer.ip()),
                    peer.port(),
                )
            } else {
                Layer::skipped(
                    "the peer is not on this host: an agent there (`lagtrace agent`) would read its sockets",
                )
            };
            let to = sockets.get().and_then(|s| s.server.clone());
            let listener = local
                .then(|| listener_of(&listeners, peer))
                .flatten()
                .cloned();
            hops.push(HopEvidence {
                depth: s.depth,
                via: s.via.map(|v| v.to_string()),
                from: s.from.clone(),
                peer: peer.to_string(),
                to,
                service: service_name(peer.port()).map(str::to_string),
                connections: s.local_ports.len() as u32,
                packets,
                sockets,
                listener,
                join: None,
            });
        }
        (hops, hop_timings)
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the capture of one peer's packets in `netns`, on the interface toward it.
fn capture_peer(netns: &NetNs, peer: SocketAddr) -> Result<RunningHopCapture, String> {
    use lagtrace_packet::capture::{Capture, CaptureOptions, route_iface};
    let iface = route_iface(peer.ip(), netns).unwrap_or_else(|| "any".into());
    let file = crate::run::temp_path("hop").map_err(|e| format!("temp file: {e}"))?;
    let o = CaptureOptions {
        iface: iface.clone(),
        filter: Some(format!(
            "tcp and host {} and port {}",
            peer.ip(),
            peer.port()
        )),
        snaplen: 160,
        netns: netns.clone(),
        count: Some(MAX_HOP_PACKETS),
        output: Some(file.0.clone()),
        ..CaptureOptions::default()
    };
    let point = format!("{iface} in {}", netns_label(netns));
    match Capture::start(&o, None) {
        Ok(handle) => Ok(RunningHopCapture {
            handle,
            file,
            point,
            peer,
        }),
        Err(e) => Err(format!("capture on {point}: {e}")),
    }
}

/// The peers to follow: the ones with the most connections, at most [`MAX_HOPS`].
fn busiest(seen: &SeenMap) -> Vec<SocketAddr> {
    let mut v: Vec<(usize, SocketAddr)> = seen
        .iter()
        .map(|(p, s)| (s.local_ports.len(), *p))
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v.into_iter().take(MAX_HOPS).map(|(_, p)| p).collect()
}

/// The listener a connection to `peer` reaches: the one on its port bound to its address,
/// else to the wildcard of its family.
fn listener_of(listeners: &[ListenerQueue], peer: SocketAddr) -> Option<&ListenerQueue> {
    let bound = |l: &ListenerQueue| l.local.parse::<SocketAddr>().ok();
    listeners
        .iter()
        .filter_map(|l| bound(l).map(|a| (a, l)))
        .filter(|(a, _)| a.port() == peer.port())
        .min_by_key(|(a, _)| (a.ip() != peer.ip(), !a.ip().is_unspecified()))
        .filter(|(a, _)| a.ip() == peer.ip() || a.ip().is_unspecified())
        .map(|(_, l)| l)
}

/// Whether `ip` is an address of `netns` itself (the kernel routes it through `lo`).
fn is_local(ip: IpAddr, netns: &NetNs) -> bool {
    lagtrace_packet::capture::route_iface(ip, netns).is_some_and(|i| i == "lo")
}

fn netns_label(n: &NetNs) -> String {
    match n {
        NetNs::Named(n) => format!("namespace {n}"),
        _ => "this namespace".into(),
    }
}

/// The service a port is known for: a hint in the text only (hops are found from sockets).
pub(crate) fn service_name(port: u16) -> Option<&'static str> {
    Some(match port {
        3306 => "mysql",
        5432 => "postgresql",
        6379 => "redis",
        11211 => "memcached",
        27017 => "mongodb",
        9042 => "cassandra",
        5672 => "amqp",
        9200 => "elasticsearch",
        2379 => "etcd",
        _ => return None,
    })
}

/// The watch loop: lists the namespace's open TCP connections every [`POLL`] and keeps
/// those held by a watched listener's processes whose local port is not the listener's.
/// The server's listener is watched first; a peer that listens in this namespace becomes a
/// watched listener in turn (its processes' connections are the next hop), down to
/// [`MAX_DEPTH`].
fn watch(
    netns: &NetNs,
    label: &str,
    (dest, port): (crate::run::Dest, u16),
    stop: &AtomicBool,
    seen: &Mutex<SeenMap>,
    late: &Mutex<Late>,
    listeners: &mut ListenTrack,
) {
    // The thread enters the server's namespace once (no thread per poll to enter it).
    if netns.enter_current_thread().is_err() {
        return;
    }
    // The namespace's listeners, every poll and once more at the end: a hop's peer listener's
    // accept queue and its drops over the run. A dump of listening sockets alone walks the
    // listener hash, not the established one: cheap at any poll rate.
    let _ = listeners.sample();
    let here = NetNs::Current;
    let mut watched = vec![Watched {
        port,
        dest,
        depth: 1,
        via: None,
        pids: Vec::new(),
        pids_at: None,
    }];
    // Socket inodes of the watched processes already looked up in a dump.
    let mut known: BTreeSet<u64> = BTreeSet::new();
    let mut dumped_at: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        for w in &mut watched {
            // Looked up again sooner while none is known (a server still starting).
            let every = if w.pids.is_empty() {
                POLL * 5
            } else {
                PIDS_EVERY
            };
            if w.pids_at.is_none_or(|t| t.elapsed() >= every) {
                w.pids =
                    crate::adapters::host::listener_pids(&here, w.dest, w.port).unwrap_or_default();
                w.pids_at = Some(Instant::now());
            }
        }
        let pids: Vec<u32> = watched
            .iter()
            .flat_map(|w| w.pids.iter().copied())
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        // The processes' own descriptor tables are cheap to read; a sock_diag dump walks the
        // kernel's whole established-connection hash (every namespace's: 262 144 buckets
        // here, ~3 ms of system time a dump), so it runs only for sockets not seen before,
        // at most every DUMP_EVERY — and during the c=N run (whose tail the verdict reads)
        // only if none has run yet, or while no peer has been found: a proxy's short
        // per-request connections missed in c=1 (each alive a millisecond or two, on a loaded
        // machine no poll caught one: no hop at all, suite at 131f7f0) are looked for on
        // every poll that shows new sockets, until one is found. A server that opens none
        // shows no new socket once its clients' connections are known, and dumps no more.
        let capturing = late.lock().unwrap_or_else(|e| e.into_inner()).on;
        let searching = seen.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
        let every = if searching { SEARCH_EVERY } else { DUMP_EVERY };
        let due = if capturing && !searching {
            dumped_at.is_none()
        } else {
            dumped_at.is_none_or(|t| t.elapsed() >= every)
        };
        let scan = (due && !pids.is_empty()).then(|| lagtrace_sockets::procfs::scan_fds(&pids));
        if let Some(scan) =
            scan.filter(|sc| dumped_at.is_none() || sc.owners.keys().any(|i| !known.contains(i)))
            && let Ok(socks) = lagtrace_sockets::diag::dump_tcp_addrs(OPEN_STATES)
        {
            dumped_at = Some(Instant::now());
            known = scan.owners.keys().copied().collect();
            let mut deeper = Vec::new();
            {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                for s in socks
                    .iter()
                    .filter(|s| s.inode != 0 && s.remote.port() != 0)
                {
                    let Some(o) = scan.owners.get(&s.inode).and_then(|o| o.first()) else {
                        continue;
                    };
                    let Some(w) = opened_by(&watched, o.pid, s, &socks) else {
                        continue;
                    };
                    let new = !seen.contains_key(&s.remote);
                    seen.entry(s.remote)
                        .or_insert_with(|| Seen {
                            from: ServerProcess {
                                pid: o.pid,
                                comm: o.comm.clone(),
                                netns: label.to_string(),
                            },
                            local_ports: BTreeSet::new(),
                            depth: w.depth,
                            via: w.via,
                        })
                        .local_ports
                        .insert(s.local.port());
                    // A peer listening in this namespace is a server of its own: its
                    // processes' connections are the next hop.
                    if new
                        && w.depth < MAX_DEPTH
                        && !watched.iter().any(|x| x.port == s.remote.port())
                        && is_local(s.remote.ip(), netns)
                    {
                        deeper.push(Watched {
                            port: s.remote.port(),
                            dest: crate::run::Dest::To(s.remote.ip()),
                            depth: w.depth + 1,
                            via: Some(s.remote),
                            pids: Vec::new(),
                            pids_at: None,
                        });
                    }
                }
                // Peers first seen while the c=N run is captured get their capture now.
                let mut late = late.lock().unwrap_or_else(|e| e.into_inner());
                if late.on {
                    let new: Vec<SocketAddr> = seen
                        .keys()
                        .filter(|p| !late.started.contains(p))
                        .copied()
                        .collect();
                    for peer in new {
                        if late.started.len() >= MAX_HOPS {
                            break;
                        }
                        late.started.insert(peer);
                        match capture_peer(netns, peer) {
                            Ok(c) => late.caps.running.push(c),
                            Err(e) => late.caps.not_captured.push((peer, e)),
                        }
                    }
                }
            }
            if !deeper.is_empty() {
                watched.extend(deeper);
                // The new listeners' processes are looked up and their sockets dumped on
                // the next poll, not DUMP_EVERY later.
                dumped_at = None;
            }
        }
        std::thread::sleep(POLL);
        let _ = listeners.sample();
    }
}

/// The watched listener whose processes opened `s` (a connection of process `pid`): the
/// shallowest one `pid` serves, when `s` is not one of the connections it accepted (its
/// local port is none of that process's listeners') nor a connection back to the server's
/// own listener.
fn opened_by<'a>(
    watched: &'a [Watched],
    pid: u32,
    s: &lagtrace_sockets::diag::DiagSocket,
    socks: &[lagtrace_sockets::diag::DiagSocket],
) -> Option<&'a Watched> {
    let mine = || watched.iter().filter(move |w| w.pids.contains(&pid));
    if mine().any(|w| w.port == s.local.port()) {
        return None;
    }
    if mine().any(|w| w.port == s.remote.port()) && is_own(socks, s.remote) {
        return None;
    }
    mine().min_by_key(|w| w.depth)
}

/// Whether `addr` is one of the namespace's own connection endpoints (a socket local there).
fn is_own(socks: &[lagtrace_sockets::diag::DiagSocket], addr: SocketAddr) -> bool {
    socks.iter().any(|s| s.local == addr)
}
