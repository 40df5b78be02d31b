//! The orchestration: runs the four layers against a URL and assembles the [`Diagnosis`].
//!
//! 1. path: SYN ping idle; `route` when the target is more than one hop away (or silent).
//! 2. app: load at c=1 (sequential keep-alive), then at c=N.
//! 3. packets: capture during the c=N run, in the namespace that owns the target address
//!    when it is on this machine, then the packet crate's streaming analyzer.
//! 4. sockets: during the c=N run, the server process's sockets (found by its listener on
//!    the target port) and its config lens; skipped when the server is not on this machine.
//!
//! A layer whose engine fails or lacks a privilege says so in its status; nothing is faked.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use lagtrace_netns::NetNs;
pub use lagtrace_sockets::serving::Dest;

use crate::adapters;
use crate::evidence::{
    AppEvidence, AppRun, Layer, Layers, PacketEvidence, PathEvidence, RttStats, SocketEvidence,
    Target,
};
use crate::{Assemble, Diagnosis, Settings};

/// Default connections of the concurrent run.
pub const DEFAULT_CONCURRENCY: u32 = 32;
/// Default load budget (c=1 and c=N together); the whole diagnosis stays under ~15 s.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(7);
/// The longest load budget accepted: every load is bounded.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Packets the capture keeps at most (it stops counting after that; the load goes on).
pub const MAX_CAPTURE_PACKETS: u64 = lagtrace_model::diagnosis::evidence::ACTIVE_CAPTURE_PACKETS;

/// How long a connect of the load may wait before it counts as failed: past the first and
/// second SYN retransmissions (1 s and 2 s after the SYN on Linux ≥ 6.5, whose
/// `tcp_syn_linear_timeouts` spaces the first ones 1 s apart; 1 s and 3 s before), so a
/// connect that needed them is a measured wait. The connects run inside their phase: one
/// still pending when the phase ends is recorded as waiting at least its age, so waiting
/// connects never lengthen the diagnosis.
pub const CONNECT_WAIT: Duration = Duration::from_millis(3_500);
/// The connect timeout of the one connect that says why a phase connected nowhere, and of
/// the c=1 phase when the path layer saw the port closed or silent (it fails fast there).
const QUICK_CONNECT: Duration = Duration::from_secs(1);

/// What to diagnose and how.
#[derive(Debug, Clone)]
pub struct DiagnoseOptions {
    /// `http://host[:port]/path` (https works for the app layer; packets see no HTTP then).
    pub url: String,
    /// Connections of the concurrent run.
    pub concurrency: u32,
    /// Load budget: c=1 gets 30%, c=N 70%.
    pub duration: Duration,
    /// Request timeout of the load.
    pub timeout: Duration,
    /// Set to stop early (Ctrl-C): each running step ends and the diagnosis covers what ran.
    pub stop: Arc<AtomicBool>,
    /// https: accept any certificate (self-signed, wrong name), like `lagtrace load --insecure`.
    pub insecure: bool,
    /// Extra request headers of the load, "Name: value" (`lagtrace load -H`).
    pub headers: Vec<String>,
    /// The server's process for the host layer; `None`: the owner of the listener on the
    /// target port, where the target's namespace can be entered.
    pub server_pid: Option<u32>,
    /// The server-side layers (packets, sockets, host) from another host (`lagtrace
    /// agent`) instead of this machine's namespaces, which are then never entered.
    pub remote: Option<Arc<dyn crate::remote::RemoteServer>>,
    /// Do not look for the server's own upstream connections (hops).
    pub no_hops: bool,
}

impl DiagnoseOptions {
    /// Defaults: c=32, 7 s of load, 2 s request timeout.
    pub fn new(url: &str) -> DiagnoseOptions {
        DiagnoseOptions {
            url: url.into(),
            concurrency: DEFAULT_CONCURRENCY,
            duration: DEFAULT_DURATION,
            timeout: Duration::from_secs(2),
            stop: Arc::new(AtomicBool::new(false)),
            insecure: false,
            headers: Vec::new(),
            server_pid: None,
            remote: None,
            no_hops: false,
        }
    }
}

/// A step of the diagnosis, for progress output.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A layer step starts (one line: what it does).
    Start(String),
    /// A layer step ended with data (one line: what it found).
    Done(String),
    /// A layer did not measure: skipped, unavailable or failed (one line: why).
    NotRun(String),
    /// Live counts of a long step (one line, replacing the previous one on a terminal).
    Progress(String),
}

/// The step line of a layer that ended: `Done` when it has data, else `NotRun`.
fn ended<T>(layer: &Layer<T>, line: String) -> Step {
    use crate::evidence::LayerStatus;
    if matches!(layer.status, LayerStatus::Ok | LayerStatus::Finding) {
        Step::Done(line)
    } else {
        Step::NotRun(line)
    }
}

/// Where the server behind the target address lives, as far as this machine can tell.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerLocation {
    /// The address is local to this namespace (loopback or one of its interfaces).
    Here,
    /// The address belongs to a namespace under /run/netns.
    Namespace(String),
    /// Neither: another host (or a namespace lagtrace cannot see).
    Elsewhere,
    /// Not here, and some namespaces could not be entered (why: the first error).
    Unknown(String),
}

/// The addresses of the calling thread's network namespace (getifaddrs: netlink, per thread).
fn local_addrs() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free with freeifaddrs below; we only
    // read `ifa_addr` according to its family.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// Whether `addr` is an address of the calling thread's namespace. (Binding to it is no
/// test: a namespace being set up, with `lo` down and no address yet, accepts any bind.)
fn is_local(addr: IpAddr) -> bool {
    addr.is_loopback() || local_addrs().contains(&addr)
}

/// Finds the namespace that owns `addr`: this one, a named one, or none.
pub fn locate(addr: IpAddr) -> ServerLocation {
    if is_local(addr) {
        return ServerLocation::Here;
    }
    let mut failed = None;
    for n in lagtrace_netns::list_named() {
        match NetNs::Named(n.clone()).run(|| is_local(addr)) {
            Ok(true) => return ServerLocation::Namespace(n),
            Ok(false) => {}
            Err(e) => {
                failed.get_or_insert(e.to_string());
            }
        }
    }
    match failed {
        Some(e) => ServerLocation::Unknown(e),
        None => ServerLocation::Elsewhere,
    }
}

/// Splits an http(s) URL into host, port and address.
pub fn parse_target(url: &str) -> Result<(Target, SocketAddr)> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        // HOST, HOST:PORT or HOST/PATH without a scheme: the URL it most likely means.
        let guess = if url.is_empty() || url.contains(char::is_whitespace) {
            String::new()
        } else {
            let u = url.trim_start_matches('/');
            let slash = if u.contains('/') { "" } else { "/" };
            format!(" (did you mean http://{u}{slash}?)")
        };
        Error::Target(format!("{url:?}: expected http://host[:port]/path{guess}"))
    })?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        s => {
            return Err(Error::Target(format!(
                "{url:?}: unsupported scheme {s:?} (http or https)"
            )));
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    if authority.is_empty() {
        return Err(Error::Target(format!("{url:?}: no host")));
    }
    if authority.starts_with(':') {
        return Err(Error::Target(format!("{url:?}: no host")));
    }
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let (h, tail) = r
            .split_once(']')
            .ok_or_else(|| Error::Target(format!("{url:?}: missing ']'")))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => lagtrace_probe::parse_port(p)?,
            None => default_port,
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), lagtrace_probe::parse_port(p)?),
            None => (authority.to_string(), default_port),
        }
    };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| Error::Target(format!("cannot resolve host {host:?}: {e}")))?
        .next()
        .ok_or_else(|| Error::Target(format!("cannot resolve host {host:?}: no address")))?;
    Ok((
        Target {
            url: url.into(),
            host,
            addr: addr.ip().to_string(),
            port,
        },
        addr,
    ))
}

fn ping(
    target: SocketAddr,
    count: u32,
    interval_ms: u64,
    stop: &AtomicBool,
) -> Result<lagtrace_probe::PingReport, lagtrace_probe::Error> {
    let mut o = lagtrace_probe::PingOptions::new(target);
    o.count = count;
    o.interval = Duration::from_millis(interval_ms);
    o.timeout = Duration::from_millis(800);
    lagtrace_probe::ping(&o, stop)
}

/// Checks the options a run cannot start without.
fn validate(opts: &DiagnoseOptions) -> Result<()> {
    if opts.concurrency == 0 {
        return Err(Error::Usage("concurrency must be at least 1".into()));
    }
    if opts.duration < Duration::from_millis(500) {
        return Err(Error::Usage("duration must be at least 500ms".into()));
    }
    if opts.duration > MAX_DURATION {
        return Err(Error::Usage(format!(
            "duration must be at most {} s (a diagnosis needs seconds, not hours)",
            MAX_DURATION.as_secs()
        )));
    }
    Ok(())
}

/// Runs the whole diagnosis. `Err` only when it cannot start (bad URL, unresolvable host);
/// everything the layers measure, failures included, is in the returned [`Diagnosis`].
pub fn run(opts: &DiagnoseOptions, progress: &dyn Fn(Step)) -> Result<Diagnosis> {
    let t0 = Instant::now();
    let (target, sa) = parse_target(&opts.url)?;
    validate(opts)?;
    let stop = &*opts.stop;
    // With a remote server side no namespace here is entered (nor looked into).
    let location = if opts.remote.is_some() {
        ServerLocation::Elsewhere
    } else {
        locate(sa.ip())
    };

    let (mut path, path_err) = path_idle(sa, stop, progress);
    let budget = Budget::split(opts.duration);
    let quick_fail = path_err.is_none() && !path.port_open;
    let mut app = AppEvidence::default();
    // Per-request records (connect waits, failures, pending ones) wherever a connection
    // can be made; where the path saw the port closed or silent, c=1 fails fast instead.
    let lo = load_options(opts, budget.c1, !quick_fail);
    // The server's own upstream connections are watched from before c=1: a proxy that
    // opens one per request shows them there, and the c=N phase captures their packets.
    let discovery = if quick_fail || opts.no_hops {
        None
    } else {
        crate::hops::Discovery::start(&location, Dest::To(sa.ip()), sa.port())
    };
    let (c1, app_reason) = app_c1(&lo, &mut app, stop, progress);

    let go_on = match c1 {
        C1::Completed => true,
        // Connects waited or failed while the SYN probes were answered: the c=N phase
        // measures how connection setup fares (`unreachable` needs no connection at all).
        C1::NoConnection => !quick_fail,
        // Requests sent on open connections got no response in time: the c=N phase and
        // its capture show where the responses go (held, lost, never sent).
        C1::NoRequest => app.c1.as_ref().is_some_and(awaited_response),
    };
    let mut hops = Vec::new();
    let (packets, sockets, host) = if !go_on || stop.load(Ordering::Relaxed) {
        let why = if stop.load(Ordering::Relaxed) {
            INTERRUPTED.to_string()
        } else if quick_fail || c1 == C1::NoConnection {
            "no connection could be made (the path layer saw the port closed or silent)".into()
        } else {
            "no request completed at c=1 on the connections it made".into()
        };
        // No connection at all to a server on this machine: a short look at its host says
        // whether its listener turns clients away (a SYN queue full of a flood) — the
        // difference between `unreachable` and a server that is there but answers no one.
        let host = if !stop.load(Ordering::Relaxed)
            && (quick_fail || c1 == C1::NoConnection)
            && matches!(
                location,
                ServerLocation::Here | ServerLocation::Namespace(_)
            ) {
            progress(Step::Start(
                "host: the listener's queues, as no connection was made".into(),
            ));
            let host = adapters::host::measure(
                &location,
                Dest::To(sa.ip()),
                sa.port(),
                sa.is_ipv6(),
                opts.server_pid,
                NO_CONNECTION_HOST_WINDOW,
            );
            progress(ended(&host, format!("host: {}", host.status.name())));
            host
        } else {
            Layer::skipped(why.clone())
        };
        (Layer::skipped(why.clone()), Layer::skipped(why), host)
    } else {
        let u = under_load(opts, &lo, budget.cn, &location, sa, discovery, progress);
        hops = u.hops;
        app.cn = Some(u.cn);
        path.under_load = u.ping;
        path.notes.extend(u.notes);
        (u.packets, u.sockets, u.host)
    };

    let path_layer = match path_err {
        Some(e) => Layer::unavailable(e),
        None => Layer::ran(path),
    };
    let app_layer = if app.c1.is_none() && app.cn.is_none() {
        Layer::error(app_reason.unwrap_or_else(|| "no load ran".into()))
    } else {
        let mut l = Layer::ran(app);
        l.reason = app_reason;
        l
    };
    let layers = Layers {
        path: path_layer,
        app: app_layer,
        packets,
        sockets,
        host,
        hops,
    };
    Ok(assemble(opts, target, layers, t0))
}

/// How long the host layer looks at a local server's host when no connection could be made.
const NO_CONNECTION_HOST_WINDOW: Duration = Duration::from_secs(1);

/// The reason a layer gives when Ctrl-C ended the run before it measured.
pub(crate) const INTERRUPTED: &str = "interrupted";

/// Sleeps `d` unless `stop` is set first (checked every 20 ms); true when stopped.
pub(crate) fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// Joins `h`, unless `stop` is set while it still runs (then gives up on it).
fn join_unless_stopped<T>(
    h: std::thread::JoinHandle<T>,
    stop: &AtomicBool,
) -> Option<std::thread::Result<T>> {
    while !h.is_finished() {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(h.join())
}

/// The load budget split between the phases: c=1 gets 30 % (at least 300 ms), c=N the rest
/// (at least 500 ms).
#[derive(Debug, Clone, Copy)]
struct Budget {
    c1: Duration,
    cn: Duration,
}

impl Budget {
    fn split(total: Duration) -> Budget {
        let c1 = total.mul_f64(0.3).max(Duration::from_millis(300));
        let cn = total.saturating_sub(c1).max(Duration::from_millis(500));
        Budget { c1, cn }
    }
}

/// Step 1: the path, idle: SYN ping, and the route when the target is more than one hop away
/// (or silent). Returns the evidence and, when the ping could not run, why.
fn path_idle(
    sa: SocketAddr,
    stop: &AtomicBool,
    progress: &dyn Fn(Step),
) -> (PathEvidence, Option<String>) {
    progress(Step::Start(format!("path: SYN ping {sa} (idle)")));
    // The client's route to the server, where the load runs (this namespace): a fix on that
    // route (quick ACKs) repeats it.
    let mut path = PathEvidence {
        route: lagtrace_packet::capture::route_get(sa.ip(), &NetNs::Current),
        ..PathEvidence::default()
    };
    let path_err;
    match ping(sa, 5, 60, stop) {
        Ok(r) => {
            path.method = adapters::path::method(&r);
            path.idle = Some(adapters::path::rtt_stats(&r));
            path.reached = adapters::path::reached(&r);
            path.port_open = adapters::path::port_open(&r);
            if let Some(n) = &r.note {
                path.notes.push(n.clone());
            }
            let hops = adapters::path::hops_away(&r);
            if (!path.reached || hops.is_some_and(|h| h > 0)) && !stop.load(Ordering::Relaxed) {
                progress(Step::Start(format!("path: route to {}", sa.ip())));
                let mut ro = lagtrace_probe::RouteOptions::new(sa.ip());
                ro.port = sa.port();
                ro.max_ttl = 16;
                ro.timeout = Duration::from_millis(800);
                match lagtrace_probe::route_until(&ro, stop) {
                    Ok(rr) => path.hops = adapters::path::hops(&rr),
                    Err(e) => path.notes.push(format!("route: {e:#}")),
                }
            }
            path_err = None;
        }
        Err(e) => path_err = Some(format!("{e:#}")),
    }
    let idle_line = match (&path_err, &path.idle) {
        (Some(e), _) => format!("path: unavailable: {e}"),
        (None, Some(i)) if i.received > 0 => format!(
            "path: SYN RTT p50 {} ({}/{} answered{})",
            lagtrace_model::Micros(i.p50_us),
            i.received,
            i.sent,
            if path.port_open {
                ""
            } else {
                ", port closed (RST)"
            }
        ),
        _ => "path: no reply".into(),
    };
    progress(if path_err.is_some() {
        Step::NotRun(idle_line)
    } else {
        Step::Done(idle_line)
    });
    (path, path_err)
}

/// The load options of the c=1 phase (the c=N phase starts from them). With `records`,
/// every request and connect is recorded and a connect may wait [`CONNECT_WAIT`].
fn load_options(opts: &DiagnoseOptions, c1: Duration, records: bool) -> lagtrace_load::LoadOptions {
    let mut lo = lagtrace_load::LoadOptions::new(&opts.url);
    lo.connections = 1;
    lo.threads = 1;
    lo.duration = Some(c1);
    lo.timeout = opts.timeout;
    lo.insecure = opts.insecure;
    lo.headers = opts.headers.clone();
    lo.connect_timeout = QUICK_CONNECT;
    if records {
        lo.records = Some(lagtrace_load::RecordOptions::default());
        lo.connect_timeout = CONNECT_WAIT;
    }
    lo
}

/// A request of `run` was sent on an open connection and its response did not come: it
/// timed out, or was still awaited when the phase ended (a phase shorter than the timeout).
fn awaited_response(run: &AppRun) -> bool {
    run.errors.timeout > 0
        || run.records.as_ref().is_some_and(|rs| {
            rs.records
                .iter()
                .any(|r| r.pending && r.error.is_none() && r.sent_first_us.is_some())
        })
}

/// How the c=1 phase ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum C1 {
    /// At least one request completed.
    Completed,
    /// No TCP connection was made.
    NoConnection,
    /// Connections were made but no request completed on them (TLS or HTTP fails).
    NoRequest,
}

/// Step 2: the app at c=1 (sequential keep-alive). Returns how it ended and, when nothing
/// completed, why (the load's error, or one more connect's).
fn app_c1(
    lo: &lagtrace_load::LoadOptions,
    app: &mut AppEvidence,
    stop: &AtomicBool,
    progress: &dyn Fn(Step),
) -> (C1, Option<String>) {
    let c1_dur = lo.duration.unwrap_or_default();
    progress(Step::Start(format!(
        "app: c=1, sequential keep-alive requests for {:.1} s",
        c1_dur.as_secs_f64()
    )));
    let cpu = crate::client_cpu::Sampler::start();
    let loaded = lagtrace_load::run(lo, None, stop);
    let client_cpu = cpu.stop();
    match loaded {
        Ok(r) => {
            let mut run = adapters::app::run(1, &r);
            run.client_cpu = client_cpu;
            let ended = if run.requests > 0 {
                C1::Completed
            } else if r.connections_opened > 0 {
                C1::NoRequest
            } else {
                C1::NoConnection
            };
            progress(Step::Done(format!(
                "app: c=1 p50 {} ({} requests)",
                lagtrace_model::Micros(run.latency.p50_us),
                run.requests
            )));
            app.c1 = Some(run);
            // With records the run has no preflight: say why nothing completed.
            let why = (ended != C1::Completed && !stop.load(Ordering::Relaxed))
                .then(|| {
                    let mut o = lo.clone();
                    o.connect_timeout = QUICK_CONNECT;
                    lagtrace_load::check(&o).err().map(|e| format!("{e:#}"))
                })
                .flatten();
            (ended, why)
        }
        Err(e) => {
            app.c1 = Some(adapters::app::failed(1));
            let msg = format!("{e:#}");
            progress(Step::NotRun(format!("app: no connection: {msg}")));
            (C1::NoConnection, Some(msg))
        }
    }
}

/// What the c=N phase measured in every layer.
pub(crate) struct UnderLoad {
    pub(crate) cn: AppRun,
    /// SYN ping under load, when it ran.
    pub(crate) ping: Option<RttStats>,
    /// Path notes (why the ping under load did not run).
    pub(crate) notes: Vec<String>,
    pub(crate) packets: Layer<PacketEvidence>,
    pub(crate) sockets: Layer<SocketEvidence>,
    pub(crate) host: Layer<lagtrace_model::host::HostReport>,
    /// The hops behind the server (local servers only).
    pub(crate) hops: Vec<lagtrace_model::diagnosis::evidence::HopEvidence>,
}

/// The SYN ping under load on its own thread (from 400 ms into the run until stopped).
pub(crate) fn start_pinger(
    sa: SocketAddr,
) -> (
    std::thread::JoinHandle<Result<lagtrace_probe::PingReport, lagtrace_probe::Error>>,
    Arc<AtomicBool>,
) {
    let ping_stop = Arc::new(AtomicBool::new(false));
    let ps = ping_stop.clone();
    let h = std::thread::spawn(move || {
        nap(Duration::from_millis(400), &ps);
        ping(sa, 10, 300, &ps)
    });
    (h, ping_stop)
}

/// The ping under load's figures, or the path note saying why there are none.
pub(crate) fn join_pinger(
    pinger: std::thread::JoinHandle<Result<lagtrace_probe::PingReport, lagtrace_probe::Error>>,
) -> (Option<RttStats>, Vec<String>) {
    let mut notes = Vec::new();
    let ping = match pinger.join() {
        Ok(Ok(r)) => Some(adapters::path::rtt_stats(&r)),
        Ok(Err(e)) => {
            notes.push(format!("SYN ping under load: {e:#}"));
            None
        }
        Err(_) => {
            notes.push("SYN ping under load: thread panicked".into());
            None
        }
    };
    (ping, notes)
}

/// The load options of the c=N phase, from the c=1 phase's, always with records: c=N runs
/// only where connections can be made, even when the path's SYN probes went unanswered and
/// c=1 went without records to fail fast (CI: a listener whose accept queue was full dropped
/// every probe, then served c=1; without records c=N's 1 s connects were in no latency, and
/// the overflowing backlog was called slow-server).
fn cn_options(
    opts: &DiagnoseOptions,
    c1: &lagtrace_load::LoadOptions,
    cn_dur: Duration,
) -> lagtrace_load::LoadOptions {
    let mut lo = c1.clone();
    lo.connections = opts.concurrency as usize;
    lo.threads = (opts.concurrency as usize).clamp(1, 2);
    lo.duration = Some(cn_dur);
    if lo.records.is_none() {
        lo.records = Some(lagtrace_load::RecordOptions::default());
        lo.connect_timeout = CONNECT_WAIT;
    }
    lo
}

/// Steps 3+4: the c=N load with the capture, the SYN ping under load and the socket
/// inspection running meanwhile.
fn under_load(
    opts: &DiagnoseOptions,
    c1: &lagtrace_load::LoadOptions,
    cn_dur: Duration,
    location: &ServerLocation,
    sa: SocketAddr,
    discovery: Option<crate::hops::Discovery>,
    progress: &dyn Fn(Step),
) -> UnderLoad {
    if let Some(remote) = &opts.remote {
        let lo = cn_options(opts, c1, cn_dur);
        return crate::remote::under_load(
            &**remote,
            lo,
            opts.concurrency,
            sa,
            !opts.no_hops,
            &opts.stop,
            progress,
        );
    }
    let stop = &*opts.stop;
    let capture = start_capture(location, sa, progress);
    let hop_captures = discovery.as_ref().map(|d| {
        let c = d.start_captures();
        if c.peers() > 0 {
            progress(Step::Start(format!(
                "hops: capturing the server's connections to {}",
                c.peer_list()
            )));
        }
        c
    });
    let (pinger, ping_stop) = start_pinger(sa);
    let host = start_host(opts, location, sa, cn_dur);
    let insp: Arc<Mutex<Option<Layer<SocketEvidence>>>> = Arc::new(Mutex::new(None));
    let inspector = {
        let loc = location.clone();
        let insp = insp.clone();
        let port = sa.port();
        let dest = Dest::To(sa.ip());
        let stop = opts.stop.clone();
        std::thread::spawn(move || {
            let l = if nap(Duration::from_millis(1200), &stop) {
                Layer::skipped(INTERRUPTED)
            } else {
                inspect_server(&loc, dest, port)
            };
            *insp.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
        })
    };
    progress(Step::Start(format!(
        "app: c={} concurrent keep-alive connections for {:.1} s; packets captured, SYN \
         ping and socket inspection meanwhile",
        opts.concurrency,
        cn_dur.as_secs_f64()
    )));
    let lo = cn_options(opts, c1, cn_dur);
    let cn = app_cn(&lo, opts.concurrency, stop, progress);
    ping_stop.store(true, Ordering::Relaxed);
    let (ping, notes) = join_pinger(pinger);
    let _ = inspector.join();
    let sockets = insp
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_else(|| Layer::error("the inspection thread did not finish"));
    progress(Step::Start("packets: analysing the capture".into()));
    let hops_seen = discovery.as_ref().is_some_and(|d| d.any_seen());
    // Captured in the server's namespace (or on its host): next to the server.
    let server_side = matches!(
        location,
        ServerLocation::Here | ServerLocation::Namespace(_)
    );
    let (mut packets, windows, front) =
        finish_capture(capture, &cn, run_analysis(&lo, &cn, hops_seen), server_side);
    progress(ended(&packets, packets_line(&packets)));
    let (mut hops, hop_timed) = match (discovery, hop_captures) {
        (Some(d), Some(c)) => d.finish(c, front.is_some()),
        _ => (Vec::new(), Vec::new()),
    };
    if let Some(front) = &front {
        join_upstreams(
            &mut packets,
            front.timed(),
            &front.of_record,
            &mut hops,
            &hop_timed,
        );
    }
    for h in &hops {
        progress(Step::Done(hop_line(h)));
    }
    progress(ended(&sockets, sockets_line(&sockets)));
    let mut host = match join_unless_stopped(host, stop) {
        Some(Ok(l)) => l,
        Some(Err(_)) => Layer::error("the host layer's thread panicked"),
        // Its window runs on; the process ends without it.
        None => Layer::skipped(format!("{INTERRUPTED} before its window closed")),
    };
    split_server_time(&mut host, &windows, cn.requests);
    progress(ended(
        &host,
        format!(
            "host: {}{}",
            host.status.name(),
            host.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
    ));
    UnderLoad {
        cn,
        ping,
        notes,
        packets,
        sockets,
        host,
        hops,
    }
}

/// The progress line of one hop: who opened connections to whom, and its packets.
pub(crate) fn hop_line(h: &lagtrace_model::diagnosis::evidence::HopEvidence) -> String {
    format!(
        "hop: {} (pid {}) → {}{}: {} connection(s) seen; {}",
        h.from.comm,
        h.from.pid,
        h.peer,
        h.to.as_ref()
            .map(|t| format!(" ({} pid {})", t.comm, t.pid))
            .unwrap_or_default(),
        h.connections,
        packets_line(&h.packets)
    )
}

/// Matches the hops' exchanges with the transactions in front of them (`join::upstream`),
/// into the hops' evidence and the packet layer's last join of records (`of_record`: per
/// record of that join, the front timing it was matched to). Both on one clock: captures
/// on the server's host (a live or passive run), or one capture holding both (`--pcap`).
pub(crate) fn join_upstreams(
    packets: &mut Layer<PacketEvidence>,
    front: crate::join::upstream::Timed<'_>,
    of_record: &[Option<usize>],
    hops: &mut [lagtrace_model::diagnosis::evidence::HopEvidence],
    hop_timed: &[Option<Timings>],
) {
    if hops.is_empty() || front.timings.is_empty() {
        return;
    }
    let timed: Vec<_> = hop_timed
        .iter()
        .map(|t| t.as_ref().map(Timings::timed))
        .collect();
    let mut none = Vec::new();
    let requests = match packets.data.as_mut().and_then(|p| p.joins.last_mut()) {
        Some(j) => &mut j.requests,
        None => &mut none,
    };
    crate::join::upstream::attach(Some(front), of_record, requests, hops, &timed);
}

/// Layer 5 on its own thread, over the c=N run: the server host's kernel evidence.
fn start_host(
    opts: &DiagnoseOptions,
    location: &ServerLocation,
    server: std::net::SocketAddr,
    window: Duration,
) -> std::thread::JoinHandle<Layer<lagtrace_model::host::HostReport>> {
    let loc = location.clone();
    let pid = opts.server_pid;
    // Named: its cost is the host layer's, and `perf`/`top -H` show it by name.
    std::thread::Builder::new()
        .name("lagtrace-host".into())
        .spawn(move || {
            adapters::host::measure(
                &loc,
                Dest::To(server.ip()),
                server.port(),
                server.is_ipv6(),
                pid,
                window,
            )
        })
        .expect("spawning the host layer's thread")
}

/// The c=N load itself.
pub(crate) fn app_cn(
    lo: &lagtrace_load::LoadOptions,
    concurrency: u32,
    stop: &AtomicBool,
    progress: &dyn Fn(Step),
) -> AppRun {
    let cpu = crate::client_cpu::Sampler::start();
    let loaded = lagtrace_load::run(lo, None, stop);
    let client_cpu = cpu.stop();
    match loaded {
        Ok(r) => {
            let mut run = adapters::app::run(concurrency, &r);
            run.client_cpu = client_cpu;
            progress(Step::Done(format!(
                "app: c={} p50 {} p99 {}, {:.0} req/s",
                concurrency,
                lagtrace_model::Micros(run.latency.p50_us),
                lagtrace_model::Micros(run.latency.p99_us),
                run.requests_per_sec
            )));
            run
        }
        Err(e) => {
            progress(Step::NotRun(format!("app: c={concurrency}: {e:#}")));
            adapters::app::failed(concurrency)
        }
    }
}

/// The progress line of the packet layer.
pub(crate) fn packets_line(packets: &Layer<PacketEvidence>) -> String {
    match packets.get() {
        Some(p) => format!(
            "packets: {} packets, {} streams, {} transactions, {} finding kinds",
            p.packets,
            p.streams,
            p.transactions,
            p.findings.len()
        ),
        None => format!(
            "packets: {}: {}",
            packets.status.name(),
            packets.reason.as_deref().unwrap_or("")
        ),
    }
}

/// The progress line of the socket layer.
pub(crate) fn sockets_line(sockets: &Layer<SocketEvidence>) -> String {
    match sockets.get() {
        Some(s) => format!(
            "sockets: {} with {} established, TCP_NODELAY off on {}, TCP_CORK on {}",
            s.server
                .as_ref()
                .map(|p| format!("{} (pid {})", p.comm, p.pid))
                .unwrap_or_else(|| "server".into()),
            s.established,
            s.nodelay.off,
            s.cork.on
        ),
        None => format!(
            "sockets: {}: {}",
            sockets.status.name(),
            sockets.reason.as_deref().unwrap_or("")
        ),
    }
}

/// Judges the layers into the [`Diagnosis`]; an interrupted run says so first.
fn assemble(opts: &DiagnoseOptions, target: Target, layers: Layers, t0: Instant) -> Diagnosis {
    let settings = Settings {
        concurrency: opts.concurrency,
        duration_us: opts.duration.as_micros() as u64,
    };
    let elapsed = t0.elapsed();
    let mut d = Diagnosis::assemble(target, settings, layers, elapsed.as_micros() as u64);
    // The report's run date: the wall clock now, less the monotonic time the run took.
    d.started_unix_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |n| n.saturating_sub(elapsed).as_micros() as u64);
    if opts.stop.load(Ordering::Relaxed) {
        crate::partial::mark(d)
    } else {
        d
    }
}

struct RunningCapture {
    handle: lagtrace_packet::capture::CaptureHandle,
    file: tempfile_path::TempPath,
    point: String,
}

/// The most packets a c=N run's capture takes: the whole run, analysed after it.
pub const MAX_RUN_PACKETS: u64 = lagtrace_model::diagnosis::evidence::RUN_CAPTURE_PACKETS;

/// The analysis of a c=N run's capture, for the load `lo` that made `run`: which
/// transactions it keeps exactly. Four times as many as the load keeps of its requests, the
/// sample keyed by the same hash of the request (so a sampled record's transaction is in the
/// capture's denser sample), plus the transaction of every record the run kept, whatever its
/// wait at the capture (slow at the client is not always slow at the capture). The
/// analysis's memory is this, whatever the run's length.
///
/// With hops behind the server (`hops`), the first [`JOIN_STRETCH`] transactions are kept
/// too, each of them: the upstream join tells which request caused which exchange by time
/// alone, and that needs every request in progress, not a sample (on a proxy at ~20 000
/// req/s a sampled front joined 2 of 1 200 records; every request, 83–87 % right).
fn run_analysis(
    lo: &lagtrace_load::LoadOptions,
    run: &AppRun,
    hops: bool,
) -> lagtrace_packet::AnalyzeOptions {
    let r = lo.records.unwrap_or_default();
    let threads = lo.threads.max(1);
    let wanted: lagtrace_model::request::WantedKeys = run
        .records
        .iter()
        .flat_map(|r| &r.records)
        .filter_map(|x| {
            let local = x.local?;
            Some(lagtrace_model::request::sample_key(
                local, x.remote, x.index,
            ))
        })
        .collect();
    lagtrace_packet::AnalyzeOptions {
        timings: true,
        timing_keep: Some(lagtrace_packet::analysis::KeepCaps {
            slow_cap: 4 * r.slow_cap * threads,
            sample_cap: 4 * r.sample_cap * threads,
        }),
        wanted: Some(Arc::new(wanted)),
        keep_first: if hops { JOIN_STRETCH } else { 0 },
        ..lagtrace_packet::AnalyzeOptions::default()
    }
}

/// The stretch of the run (its first transactions) where the upstream join has every
/// request: each hop's analysis keeps its first `max_transactions` exchanges (100 000 by
/// default), the same stretch for a proxy. ~20 MB of timings a side at most.
pub(crate) const JOIN_STRETCH: usize = 100_000;

pub(crate) use tempfile_path::{TempPath, new as temp_path};

/// A temporary file removed on drop (no extra crate: the diagnose crate keeps its deps).
mod tempfile_path {
    use std::path::PathBuf;

    /// Removes the file when dropped.
    pub struct TempPath(pub PathBuf);

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A new unique path under the temp dir (created empty, mode 0600).
    pub fn new(tag: &str) -> std::io::Result<TempPath> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir();
        for i in 0..100u32 {
            let p = dir.join(format!(
                "lagtrace-{tag}-{}-{}-{i}.pcap",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0)
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
            {
                Ok(_) => return Ok(TempPath(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other("no free temporary file name"))
    }
}

fn start_capture(
    loc: &ServerLocation,
    sa: SocketAddr,
    progress: &dyn Fn(Step),
) -> Result<RunningCapture, Box<Layer<PacketEvidence>>> {
    use lagtrace_model::Capability;
    use lagtrace_packet::capture::{Capture, CaptureOptions, route_iface};
    let (netns, label) = match loc {
        ServerLocation::Namespace(n) => (NetNs::Named(n.clone()), format!("namespace {n}")),
        _ => (NetNs::Current, "this namespace".to_string()),
    };
    // The interface toward the client (in the server's namespace) or toward the target.
    let iface = match loc {
        ServerLocation::Namespace(_) => our_source(sa)
            .and_then(|src| route_iface(src, &netns))
            .unwrap_or_else(|| "any".into()),
        _ => route_iface(sa.ip(), &NetNs::Current).unwrap_or_else(|| "any".into()),
    };
    let file =
        tempfile_path::new("diagnose").map_err(|e| Layer::error(format!("temp file: {e}")))?;
    let o = CaptureOptions {
        iface: iface.clone(),
        filter: Some(format!("tcp port {} and host {}", sa.port(), sa.ip())),
        snaplen: 160,
        netns,
        count: Some(MAX_RUN_PACKETS),
        output: Some(file.0.clone()),
        ..CaptureOptions::default()
    };
    let point = format!("{iface} in {label}");
    progress(Step::Start(format!("packets: capturing on {point}")));
    match Capture::start(&o, None) {
        Ok(handle) => Ok(RunningCapture {
            handle,
            file,
            point,
        }),
        Err(e) => {
            let msg = e.to_string();
            if let Some(p) = e.privilege() {
                // Capturing always needs CAP_NET_RAW; name what else was refused too.
                let mut caps = vec![Capability::NetRaw.name()];
                caps.extend(
                    p.capabilities
                        .iter()
                        .filter(|c| **c != Capability::NetRaw)
                        .map(|c| c.name()),
                );
                // Once: the engine's message may name them already.
                Err(Box::new(Layer::unavailable(
                    if caps.iter().all(|c| msg.contains(c)) {
                        msg
                    } else {
                        format!("capture needs {} (run as root): {msg}", caps.join(" and "))
                    },
                )))
            } else {
                Err(Box::new(Layer::error(format!("capture on {point}: {msg}"))))
            }
        }
    }
}

/// Our source address toward the target (no packet is sent: UDP connect only routes).
fn our_source(sa: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = if sa.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(sa).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// Stops the capture and analyses it — the whole run, after it, so that the analysis takes
/// no CPU from the server and the load while they are measured — with the timings of the
/// transactions `analysis` keeps, so the c=N run's kept records (`run.records`) are joined
/// with their packets (`joins`). The kept records are joined, not the run's every record:
/// they hold every request at or above the p99 (the p99.9 set too, in runs of up to 200 000
/// requests) and a weighted sample of the rest, which is all the tail split reads, and the
/// JSON's `joins` then follow its `records` one for one.
fn finish_capture(
    c: Result<RunningCapture, Box<Layer<PacketEvidence>>>,
    run: &AppRun,
    analysis: lagtrace_packet::AnalyzeOptions,
    server_side: bool,
) -> Analysed {
    let c = match c {
        Ok(c) => c,
        Err(l) => return (*l, Vec::new(), None),
    };
    let stats = match c.handle.stop() {
        Ok(s) => s,
        Err(e) => return (Layer::error(format!("capture: {e:#}")), Vec::new(), None),
    };
    analyse_file(
        &c.file.0,
        &analysis,
        c.point,
        stats.dropped_by_kernel,
        run,
        server_side,
    )
}

/// Each timed transaction's server time (the request's last byte to the response's first
/// byte at the capture) on the capture's clock — `CLOCK_REALTIME` for a live capture on
/// this host, the clock the off-CPU blocks are put on.
fn server_windows(a: &lagtrace_model::analyze::Analysis) -> Vec<lagtrace_host::offcpu::Window> {
    let base = a.first_ts_ns / 1000;
    a.timings
        .iter()
        .filter_map(|t| {
            Some(lagtrace_host::offcpu::Window {
                start_us: base + t.request_last_at_us?,
                end_us: base + t.response_first_at_us?,
                weight: t.weight,
            })
        })
        .collect()
}

/// The host layer's off-CPU blocks inside the requests' server time (`windows`, from the
/// capture of the same run), and the CPU each request cost (the watched threads' CPU time
/// over the `requests` served in the window).
fn split_server_time(
    host: &mut Layer<lagtrace_model::host::HostReport>,
    windows: &[lagtrace_host::offcpu::Window],
    requests: u64,
) {
    let Some(h) = host.data.as_mut() else {
        return;
    };
    // The processes' own CPU accounting (every thread, those born or gone within the
    // window too), else their threads' seen at both ends.
    let cpu = h
        .cpu
        .get()
        .map(|c| c.watched_us)
        .or_else(|| h.threads.get().map(|t| t.run_us))
        .filter(|_| requests > 0)
        .map(|us| us / requests);
    if let Some(off) = h.offcpu.data.as_mut()
        && !windows.is_empty()
    {
        off.during_requests = lagtrace_host::offcpu::split(windows, off, cpu);
        off.during_slowest = lagtrace_host::offcpu::slowest(windows, off);
    }
}

/// Analyses a capture received as pcap bytes (a remote server side's) like a local one.
pub(crate) fn analyse_pcap_bytes(
    pcap: &[u8],
    point: String,
    dropped: u64,
    run: &AppRun,
) -> Layer<PacketEvidence> {
    let file = match tempfile_path::new("remote") {
        Ok(f) => f,
        Err(e) => return Layer::error(format!("temp file: {e}")),
    };
    if let Err(e) = std::fs::write(&file.0, pcap) {
        return Layer::error(format!("temp file: {e}"));
    }
    analyse(&file.0, point, dropped, run)
}

/// The packet layer of a capture file, joined with the run's kept records.
pub(crate) fn analyse(
    path: &std::path::Path,
    point: String,
    dropped: u64,
    run: &AppRun,
) -> Layer<PacketEvidence> {
    analyse_windows(path, point, dropped, run, false).0
}

/// [`analyse`], and (`timed`, or when the run has records) the capture's timed
/// transactions.
pub(crate) fn analyse_timed(
    path: &std::path::Path,
    point: String,
    dropped: u64,
    run: &AppRun,
    timed: bool,
) -> (Layer<PacketEvidence>, Option<Timings>) {
    let (l, _, t) = analyse_windows(path, point, dropped, run, timed);
    (l, t)
}

/// A capture's timed transactions on its clock, kept for the upstream join
/// ([`crate::join::upstream`]).
pub struct Timings {
    /// The capture's first packet, µs since the epoch.
    pub base_us: i64,
    /// Its timed transactions.
    pub timings: Vec<lagtrace_model::analyze::TxnTiming>,
    /// Per kept record of the run (in the order of the packet layer's last join), the
    /// timing it was matched to.
    pub of_record: Vec<Option<usize>>,
}

impl Timings {
    /// The timings with their clock, as the join takes them.
    pub fn timed(&self) -> crate::join::upstream::Timed<'_> {
        crate::join::upstream::Timed {
            base_us: self.base_us,
            timings: &self.timings,
        }
    }
}

/// A capture's packet layer, its timed transactions' server-time windows, and (when the
/// analysis kept timings) the timings.
type Analysed = (
    Layer<PacketEvidence>,
    Vec<lagtrace_host::offcpu::Window>,
    Option<Timings>,
);

/// [`analyse_timed`], with the timed transactions' server-time windows.
fn analyse_windows(
    path: &std::path::Path,
    point: String,
    dropped: u64,
    run: &AppRun,
    timed: bool,
) -> Analysed {
    let opts = lagtrace_packet::AnalyzeOptions {
        timings: run.records.is_some() || timed,
        ..lagtrace_packet::AnalyzeOptions::default()
    };
    analyse_file(path, &opts, point, dropped, run, false)
}

/// Analyses the capture `file` with `opts` into [`layers_of`] (`server_side`: the capture is
/// known to be next to the server).
fn analyse_file(
    file: &std::path::Path,
    opts: &lagtrace_packet::AnalyzeOptions,
    point: String,
    dropped: u64,
    run: &AppRun,
    server_side: bool,
) -> Analysed {
    match lagtrace_packet::analyze_file(file, opts) {
        Ok(a) => layers_of(a, file, point, dropped, run, opts.timings, server_side),
        Err(e) => (Layer::error(format!("analysis: {e:#}")), Vec::new(), None),
    }
}

/// The frames the example flow is drawn from: the capture's first.
const EXAMPLE_FRAMES: u64 = MAX_CAPTURE_PACKETS;

/// The packet layer of an analysis of `file`, its records joined, its example flow, and its
/// timings when `timed`.
fn layers_of(
    a: lagtrace_model::analyze::Analysis,
    file: &std::path::Path,
    point: String,
    dropped: u64,
    run: &AppRun,
    timed: bool,
    server_side: bool,
) -> Analysed {
    let windows = server_windows(&a);
    let mut ev = adapters::packets::evidence(&a, point, dropped, server_side);
    let mut of_record = Vec::new();
    if let Some(records) = &run.records
        && !a.timings.is_empty()
    {
        let j = crate::join::join_until(records, a.first_ts_ns, Some(a.duration_us), &a.timings);
        of_record = j.requests.iter().map(|r| r.timing).collect();
        ev.joins.push(j.evidence(run.concurrency));
    }
    // Second pass over the file's first frames, keeping the example stream's packets for
    // its flow (an example is drawn from there: a run's whole capture is read once).
    if let Some(s) = adapters::packets::example_stream(&a, EXAMPLE_FRAMES) {
        let o2 = lagtrace_packet::AnalyzeOptions {
            keep_stream: Some(s),
            ..lagtrace_packet::AnalyzeOptions::default()
        };
        if let Ok(a2) = lagtrace_packet::analyze_file_prefix(file, &o2, EXAMPLE_FRAMES) {
            ev.example_flow = adapters::packets::flow(&a2, s, 14);
        }
    }
    let timings = timed.then_some(Timings {
        base_us: a.first_ts_ns / 1000,
        of_record,
        timings: a.timings,
    });
    if a.frames == 0 {
        let mut l = Layer::ran(ev);
        l.reason = Some("no packet captured".into());
        return (l, windows, timings);
    }
    (Layer::ran(ev), windows, timings)
}

/// Layer 4: the server on `port` where the address lives: the listener serving `dest`.
pub fn inspect_server(loc: &ServerLocation, dest: Dest, port: u16) -> Layer<SocketEvidence> {
    let (netns, label) = match loc {
        ServerLocation::Here => (NetNs::Current, "current".to_string()),
        ServerLocation::Namespace(n) => (NetNs::Named(n.clone()), n.clone()),
        ServerLocation::Unknown(e) => {
            return Layer::unavailable(format!(
                "cannot tell whether the server is on this machine: the namespaces under \
                 /run/netns cannot be entered ({e})"
            ));
        }
        ServerLocation::Elsewhere => {
            return Layer::skipped(
                "the server is not on this machine: its address belongs neither to this \
                 namespace nor to any under /run/netns, so its sockets cannot be inspected",
            );
        }
    };
    let o = lagtrace_sockets::InspectOptions {
        netns,
        port: Some(port),
        ..lagtrace_sockets::InspectOptions::default()
    };
    match lagtrace_sockets::inspect(&o) {
        Ok(ins) => match adapters::sockets::evidence(&ins, dest, port, &label) {
            // The listener is there but its process could not be looked into: the layer
            // keeps what it read (queues, TCP_INFO) and is not `ok` (no socket options).
            Some(ev)
                if ev.server.is_none()
                    && !adapters::held(lagtrace_model::Capability::SysPtrace) =>
            {
                let mut l = Layer::ran(ev);
                l.status = crate::evidence::LayerStatus::Unavailable;
                l.reason = Some(format!(
                    "the server's process could not be read, so neither its socket options \
                     nor its config{}",
                    adapters::missing(lagtrace_model::Capability::SysPtrace)
                ));
                l
            }
            Some(ev) => Layer::ran(ev),
            None => Layer::skipped(format!(
                "no listening socket on :{port} in namespace {label}"
            )),
        },
        Err(e) => Layer::unavailable(format!("socket inspection: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_n_phase_records_its_requests_even_when_c1_failed_fast() {
        let opts = DiagnoseOptions::new("http://127.0.0.1:1/");
        let quick = load_options(&opts, Duration::from_secs(1), false);
        assert!(quick.records.is_none());
        let cn = cn_options(&opts, &quick, Duration::from_secs(2));
        assert!(cn.records.is_some());
        assert_eq!(cn.connect_timeout, CONNECT_WAIT);
        assert_eq!(cn.connections, opts.concurrency as usize);
    }

    #[test]
    fn urls_parse_into_targets_and_bad_ones_fail_clearly() {
        let (t, sa) = parse_target("http://127.0.0.1:8080/x").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8080));
        assert_eq!(sa.port(), 8080);
        assert_eq!(parse_target("http://127.0.0.1/").unwrap().1.port(), 80);
        assert_eq!(parse_target("https://[::1]/").unwrap().1.port(), 443);
        for bad in [
            "127.0.0.1:80",
            "ftp://x/",
            "http:///",
            "http://127.0.0.1:0/",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
        // The scheme is case-insensitive; without one, the error says the URL meant.
        assert_eq!(parse_target("HTTP://127.0.0.1:81/").unwrap().1.port(), 81);
        assert_eq!(parse_target("Https://127.0.0.1/").unwrap().1.port(), 443);
        let e = parse_target("127.0.0.1:8080").unwrap_err().to_string();
        assert!(e.contains("did you mean http://127.0.0.1:8080/?"), "{e}");
        let e = parse_target("10.0.0.2/api").unwrap_err().to_string();
        assert!(e.contains("did you mean http://10.0.0.2/api?"), "{e}");
    }

    #[test]
    fn loopback_is_here_and_a_foreign_address_is_elsewhere() {
        assert_eq!(locate("127.0.0.1".parse().unwrap()), ServerLocation::Here);
        // TEST-NET-1 (RFC 5737) is never assigned; nothing is sent.
        assert_eq!(
            locate("192.0.2.77".parse().unwrap()),
            ServerLocation::Elsewhere
        );
    }
}
