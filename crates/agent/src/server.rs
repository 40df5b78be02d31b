//! The agent: an HTTP/1.1 (hyper + axum) server over rustls serving one port's server-side
//! layers to authenticated clients.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use lagtrace_diagnose::ServerLocation;
use lagtrace_diagnose::evidence::{Layer, PacketEvidence};
use lagtrace_diagnose::hops::{Discovery, HopCaptures};
use lagtrace_diagnose::run::Dest;
use lagtrace_model::host::HostReport;

use crate::auth::{Bucket, Token};
use crate::proto::{
    ApiError, CaptureSummary, ClockReply, ErrorReply, MAX_BODY, SessionFinished, SessionOpened,
    parse_session_request,
};

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The one listening port whose owner the agent serves.
    pub port: u16,
    /// The shared token.
    pub token: Token,
    /// The longest window a session may ask for.
    pub max_window: Duration,
    /// How long a finished or unfinished session's results wait for the client after the
    /// window's end before they are dropped (the session expires).
    pub grace: Duration,
    /// Requests per second allowed (all clients together), and the burst.
    pub rate_per_sec: f64,
    /// Burst of the rate limit.
    pub burst: u32,
    /// Test only: added to every time the agent reports (its clock and its capture).
    pub skew_ns: i64,
    /// Packets a capture keeps at most.
    pub max_packets: u64,
}

impl AgentConfig {
    /// Defaults for `port` and `token`: windows up to 10 min, 30 s grace, 20 req/s.
    pub fn new(port: u16, token: Token) -> AgentConfig {
        AgentConfig {
            port,
            token,
            max_window: Duration::from_secs(600),
            grace: Duration::from_secs(30),
            rate_per_sec: 20.0,
            burst: 40,
            skew_ns: 0,
            max_packets: 200_000,
        }
    }
}

/// A capture running for a session.
struct Running {
    handle: lagtrace_packet::capture::CaptureHandle,
    file: Held,
    point: String,
}

/// A session's capture file: an anonymous file in memory (`memfd_create`), the agent's
/// alone, named by its descriptor (`/proc/self/fd/N`) for libpcap to write. Nothing on any
/// filesystem: another user has nothing to open, and when the session is dropped or the
/// agent exits — SIGKILL included — its memory goes with the descriptor.
struct Held {
    fd: std::os::fd::OwnedFd,
    path: PathBuf,
}

impl Held {
    fn new() -> std::io::Result<Held> {
        use std::os::fd::AsRawFd;
        let fd =
            rustix::fs::memfd_create("lagtrace-agent-capture", rustix::fs::MemfdFlags::CLOEXEC)?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Held { fd, path })
    }

    /// The file through a descriptor of its own (never by its number, which a dropped
    /// session gives back to the process), read and written at offsets.
    fn file(&self) -> std::io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.fd.try_clone()?))
    }

    /// The whole file.
    fn read(&self) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = self.file()?;
        let mut b = vec![0u8; usize::try_from(f.metadata()?.len()).unwrap_or(0)];
        f.read_exact_at(&mut b, 0)?;
        Ok(b)
    }

    /// `b` over the file from its start (the same length: the times moved in place).
    fn rewrite(&self, b: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file()?.write_all_at(b, 0)
    }
}

/// One open window.
struct Session {
    id: String,
    peer: IpAddr,
    port: u16,
    /// Which listener on the port the session is about ([`session_dest`]).
    dest: Dest,
    started: Instant,
    window: Duration,
    capture: Option<Result<Running, Box<Layer<PacketEvidence>>>>,
    host: Option<std::thread::JoinHandle<Layer<HostReport>>>,
    /// The watch of the server's own connections (its hops) and their captures.
    hops: Option<(Discovery, HopCaptures)>,
    finished: Option<SessionFinished>,
    pcap: Option<std::sync::Arc<Held>>,
}

impl Session {
    /// Whether this is the session `id` (compared as bytes).
    fn is(&self, id: &str) -> bool {
        self.id.as_bytes() == id.as_bytes()
    }

    fn expires(&self, grace: Duration) -> Instant {
        self.started + self.window + grace
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The capture's memory goes with its descriptor.
        if let Some(Ok(r)) = self.capture.take() {
            let _ = r.handle.stop();
        }
    }
}

struct Shared {
    cfg: AgentConfig,
    /// The rate limit of requests with the token.
    bucket: Mutex<Bucket>,
    /// The rate limit of refusals: a flood without the token empties this one only, and
    /// the caller who has the token keeps its share.
    refusals: Mutex<Bucket>,
    session: Mutex<Option<Session>>,
    /// The last session that ended by itself (its id and caller), answered `410 expired`.
    ended: Mutex<Option<(String, IpAddr)>>,
    /// The open connections, for admission.
    conns: Mutex<Conns>,
}

type St = Arc<Shared>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The agent's wall clock (ns since the epoch), with the test-only skew.
fn now_ns(skew: i64) -> i64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    t.saturating_add(skew)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let body = serde_json::to_vec(&ErrorReply {
            error: self.message,
        })
        .unwrap_or_default();
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(b) => {
            let mut r = (status, b).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => ApiError::new(500, format!("encoding the reply: {e}")).into_response(),
    }
}

/// Rate limit (unauthenticated floods too, on a budget of their own), then the token; a
/// refusal says only what was refused.
async fn gate(State(st): State<St>, req: Request, next: Next) -> Response {
    // Exactly one Authorization header: with two, which one a proxy or the agent reads
    // first is not for the caller to choose.
    let mut auth = req.headers().get_all(header::AUTHORIZATION).iter();
    let (first, second) = (auth.next(), auth.next());
    let presented = first
        .filter(|_| second.is_none())
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or(b"");
    let authorized = second.is_none() && st.cfg.token.matches(presented);
    let bucket = if authorized { &st.bucket } else { &st.refusals };
    if !lock(bucket).take(Instant::now()) {
        return closing(ApiError::new(429, "too many requests").into_response());
    }
    if !authorized {
        // Refused: the connection ends with the answer (a client without the token gets
        // one request per connection, and its connection's slot back).
        return closing(ApiError::new(401, "unauthorized").into_response());
    }
    if let Some(c) = req.extensions().get::<Arc<Conn>>() {
        lock(&st.conns).authenticated(c);
    }
    if req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > MAX_BODY)
    {
        return ApiError::new(413, "request too large").into_response();
    }
    // The body whole within its time (a short or endless one would hold the connection):
    // read here, handed on in memory.
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return ApiError::new(413, "request too large").into_response(),
        Err(_) => {
            return closing(
                ApiError::new(408, "the request's body did not arrive in time").into_response(),
            );
        }
    };
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// `r`, and the connection closes after it.
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn clock(State(st): State<St>) -> Response {
    let recv = now_ns(st.cfg.skew_ns);
    let reply = ClockReply {
        recv_unix_ns: recv,
        send_unix_ns: now_ns(st.cfg.skew_ns),
    };
    json(StatusCode::OK, &reply)
}

fn random_id() -> Result<String, ApiError> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| ApiError::new(500, "no randomness"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

async fn open(
    State(st): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Body,
) -> Result<Response, ApiError> {
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::new(413, "request too large"))?;
    let max_ms = u64::try_from(st.cfg.max_window.as_millis()).unwrap_or(u64::MAX);
    let req = parse_session_request(&body, max_ms)?;
    if req.port != st.cfg.port {
        return Err(ApiError::new(
            403,
            "refused: this agent serves another port's owner only",
        ));
    }
    let st2 = st.clone();
    let opened = tokio::task::spawn_blocking(move || {
        open_blocking(
            &st2,
            peer.ip(),
            req.addr,
            req.port,
            req.window_ms,
            !req.no_hops,
        )
    })
    .await
    .map_err(|_| ApiError::new(500, "the session did not start"))??;
    tokio::spawn(end_on_time(
        st.clone(),
        opened.session.clone(),
        Duration::from_millis(opened.window_ms),
    ));
    Ok(json(StatusCode::CREATED, &opened))
}

/// A session ends on time by itself, whether or not its caller comes back: its capture
/// stops at the window's end (the results kept for the grace period), and at the end of the
/// grace period the session is dropped, its capture file with it.
async fn end_on_time(st: St, id: String, window: Duration) {
    tokio::time::sleep(window).await;
    let (st2, id2) = (st.clone(), id.clone());
    let _ = tokio::task::spawn_blocking(move || {
        let mut slot = lock(&st2.session);
        if let Some(s) = slot.as_mut().filter(|s| s.is(&id2)) {
            // An error is the caller's to read (its finish gets it again); here the
            // capture is stopped either way.
            let _ = finish_blocking(&st2.cfg, s);
        }
    })
    .await;
    tokio::time::sleep(st.cfg.grace).await;
    let mut slot = lock(&st.session);
    if let Some(s) = slot.take_if(|s| s.is(&id)) {
        *lock(&st.ended) = Some((s.id.clone(), s.peer));
    }
}

fn open_blocking(
    st: &Shared,
    peer: IpAddr,
    addr: Option<IpAddr>,
    port: u16,
    window_ms: u64,
    follow_hops: bool,
) -> Result<SessionOpened, ApiError> {
    let mut slot = lock(&st.session);
    if let Some(s) = slot.as_ref() {
        if Instant::now() < s.expires(st.cfg.grace) {
            return Err(ApiError::new(409, "busy: another session is open"));
        }
        *slot = None;
    }
    let window = Duration::from_millis(window_ms);
    // One dump of the listeners decides the session's listener and the capture's local end.
    let ls = listeners();
    let dest = session_dest(&ls, addr, peer, port);
    let capture = start_capture(&st.cfg, peer, &local_end_of(&ls, dest, port), port);
    let host = {
        let loc = ServerLocation::Here;
        // The client's family is the server's: the rule walk reads those tables.
        let ipv6 = peer.to_canonical().is_ipv6();
        std::thread::spawn(move || {
            lagtrace_diagnose::adapters::host::measure(&loc, dest, port, ipv6, None, window)
        })
    };
    // The server's own connections to its upstreams, followed over the window as a local
    // run follows them (each peer captured once the watch sees it).
    let hops = follow_hops
        .then(|| Discovery::start(&ServerLocation::Here, dest, port))
        .flatten()
        .map(|d| {
            let caps = d.start_captures();
            (d, caps)
        });
    let id = random_id()?;
    let opened = SessionOpened {
        session: id.clone(),
        capture: match &capture {
            Ok(r) => Ok(r.point.clone()),
            Err(l) => Err(l.reason.clone().unwrap_or_default()),
        },
        window_ms,
    };
    *slot = Some(Session {
        id,
        peer,
        port,
        dest,
        started: Instant::now(),
        window,
        capture: Some(capture),
        host: Some(host),
        hops,
        finished: None,
        pcap: None,
    });
    Ok(opened)
}

/// The packets of `peer`'s connections to the served `port`, each way: from the peer to the
/// port, and from the port to the peer. Not the server host's own connections to the peer's
/// port `port`, nor the peer's connections from a client port `port` to another listener
/// (`tcp port P and host PEER` took both). `local`: the host's end — the addresses of the
/// listener that serves the peer, or those of the other listeners on the port to leave out
/// ([`local_end_of`]).
fn capture_filter(peer: IpAddr, port: u16, local: &LocalEnd) -> String {
    let a = peer.to_canonical();
    let hosts = |dir: &str, v: &[IpAddr]| {
        v.iter()
            .map(|h| format!("{dir} host {}", h.to_canonical()))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let (inb, out) = match local {
        LocalEnd::Any => (String::new(), String::new()),
        LocalEnd::Only(v) => (
            format!(" and ({})", hosts("dst", v)),
            format!(" and ({})", hosts("src", v)),
        ),
        LocalEnd::Not(v) => (
            format!(" and not ({})", hosts("dst", v)),
            format!(" and not ({})", hosts("src", v)),
        ),
    };
    format!(
        "tcp and ((src host {a} and dst port {port}{inb}) or (dst host {a} and src port {port}{out}))"
    )
}

/// The host's end of the served connections.
#[derive(Debug, Clone, PartialEq)]
enum LocalEnd {
    /// Any of its addresses (one listener on the port, or none found).
    Any,
    /// These: the serving listener is bound to them.
    Only(Vec<IpAddr>),
    /// Any but these: the serving listener is a wildcard, and other listeners on the port
    /// are bound to these addresses (a connection to one of them is theirs).
    Not(Vec<IpAddr>),
}

/// The listening sockets' addresses in the agent's namespace (none when the dump fails).
fn listeners() -> Vec<SocketAddr> {
    lagtrace_sockets::diag::dump_tcp(1 << 10)
        .map(|v| v.iter().map(|s| s.local).collect())
        .unwrap_or_default()
}

/// Which listener on `port` a session is about: the one serving `addr`, the address the
/// caller connects to, when a listener here serves it; else (no address sent, or one this
/// host does not have: NAT) the caller's own address decides.
fn session_dest(ls: &[SocketAddr], addr: Option<IpAddr>, peer: IpAddr, port: u16) -> Dest {
    match addr {
        Some(a)
            if !lagtrace_sockets::serving::serving(ls, |s| *s, port, Dest::To(a)).is_empty() =>
        {
            Dest::To(a)
        }
        _ => Dest::From(peer),
    }
}

/// The listener among `listeners` that serves `dest` on `port` (the rule every layer
/// follows, `lagtrace_sockets::serving`) as the capture's local end.
fn local_end_of(listeners: &[SocketAddr], dest: Dest, port: u16) -> LocalEnd {
    let serving = lagtrace_sockets::serving::serving(listeners, |s| *s, port, dest);
    if serving.is_empty() {
        return LocalEnd::Any;
    }
    if serving.iter().any(|s| s.ip().is_unspecified()) {
        let mut others: Vec<IpAddr> = listeners
            .iter()
            .filter(|l| l.port() == port && !l.ip().is_unspecified())
            .map(|l| l.ip())
            .collect();
        others.sort();
        others.dedup();
        return if others.is_empty() {
            LocalEnd::Any
        } else {
            LocalEnd::Not(others)
        };
    }
    let mut v: Vec<IpAddr> = serving.iter().map(|s| s.ip()).collect();
    v.sort();
    v.dedup();
    LocalEnd::Only(v)
}

/// The capture of `peer`'s connections to `port`, on the interface toward `peer`.
fn start_capture(
    cfg: &AgentConfig,
    peer: IpAddr,
    local: &LocalEnd,
    port: u16,
) -> Result<Running, Box<Layer<PacketEvidence>>> {
    use lagtrace_packet::capture::{Capture, CaptureOptions, route_iface};
    let netns = lagtrace_netns::NetNs::Current;
    let iface = route_iface(peer, &netns).unwrap_or_else(|| "any".into());
    // In memory, the agent's alone: it holds the caller's packets (their session cookies
    // among them).
    let file = Held::new()
        .map_err(|e| Box::new(Layer::error(format!("the capture's memory file: {e}"))))?;
    let o = CaptureOptions {
        iface: iface.clone(),
        filter: Some(capture_filter(peer, port, local)),
        snaplen: 160,
        netns,
        count: Some(cfg.max_packets),
        output: Some(file.path.clone()),
        ..CaptureOptions::default()
    };
    let host = rustix::system::uname();
    let point = format!(
        "{iface} on the agent's host {}",
        host.nodename().to_string_lossy()
    );
    match Capture::start(&o, None) {
        Ok(handle) => Ok(Running {
            handle,
            file,
            point,
        }),
        Err(e) if e.privilege().is_some() => Err(Box::new(Layer::unavailable(format!(
            "the agent cannot capture: {e} (it needs CAP_NET_RAW)"
        )))),
        Err(e) => Err(Box::new(Layer::error(format!("capture on {point}: {e}")))),
    }
}

/// The session `id` of `peer`, unless it expired (then it is dropped).
fn with_session<R>(
    st: &Shared,
    id: &str,
    peer: IpAddr,
    f: impl FnOnce(&mut Session) -> Result<R, ApiError>,
) -> Result<R, ApiError> {
    let mut slot = lock(&st.session);
    let s = match slot.as_mut() {
        Some(s) if s.is(id) && s.peer == peer => s,
        _ if lock(&st.ended)
            .as_ref()
            .is_some_and(|(e, p)| e.as_bytes() == id.as_bytes() && *p == peer) =>
        {
            return Err(ApiError::new(410, "session expired"));
        }
        _ => return Err(ApiError::new(404, "no such session")),
    };
    if Instant::now() >= s.expires(st.cfg.grace) {
        *slot = None;
        return Err(ApiError::new(410, "session expired"));
    }
    f(s)
}

async fn sockets(
    State(st): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (port, dest) = with_session(&st, &id, peer.ip(), |s| Ok((s.port, s.dest)))?;
    let l = tokio::task::spawn_blocking(move || {
        lagtrace_diagnose::run::inspect_server(&ServerLocation::Here, dest, port)
    })
    .await
    .map_err(|_| ApiError::new(500, "the inspection failed"))?;
    Ok(json(StatusCode::OK, &l))
}

async fn finish(
    State(st): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let end = with_session(&st, &id, peer.ip(), |s| Ok(s.started + s.window))?;
    tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
    let st2 = st.clone();
    let done = tokio::task::spawn_blocking(move || {
        with_session(&st2, &id, peer.ip(), |s| finish_blocking(&st2.cfg, s))
    })
    .await
    .map_err(|_| ApiError::new(500, "the session did not finish"))??;
    Ok(json(StatusCode::OK, &done))
}

fn finish_blocking(cfg: &AgentConfig, s: &mut Session) -> Result<SessionFinished, ApiError> {
    if let Some(f) = &s.finished {
        return Ok(f.clone());
    }
    let host = match s.host.take().map(|h| h.join()) {
        Some(Ok(l)) => l,
        _ => Layer::error("the host layer's thread failed"),
    };
    let capture = match s.capture.take() {
        Some(Ok(r)) => {
            let stopped = r.handle.stop();
            let file = std::sync::Arc::new(r.file);
            s.pcap = Some(file.clone());
            match stopped {
                Ok(stats) => skew_file(&file, cfg.skew_ns)
                    .map(|bytes| CaptureSummary {
                        point: r.point.clone(),
                        packets: stats.captured,
                        dropped: stats.dropped_by_kernel,
                        bytes,
                    })
                    .map_err(Layer::error),
                Err(e) => Err(Layer::error(format!("capture: {e:#}"))),
            }
        }
        Some(Err(l)) => Err(*l),
        None => Err(Layer::error("no capture")),
    };
    let hops = s
        .hops
        .take()
        .map(|(d, caps)| d.finish(caps, false).0)
        .unwrap_or_default();
    let f = SessionFinished {
        host,
        capture,
        hops,
    };
    s.finished = Some(f.clone());
    Ok(f)
}

/// Applies the test-only skew to the capture's timestamps (they are the agent's clock);
/// returns the file's size.
fn skew_file(file: &Held, skew_ns: i64) -> Result<u64, String> {
    let mut b = file.read().map_err(|e| format!("capture file: {e}"))?;
    if skew_ns != 0 {
        crate::pcap::shift(&mut b, skew_ns)?;
        file.rewrite(&b).map_err(|e| format!("capture file: {e}"))?;
    }
    Ok(b.len() as u64)
}

async fn pcap(
    State(st): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let file = with_session(&st, &id, peer.ip(), |s| {
        s.pcap
            .clone()
            .ok_or_else(|| ApiError::new(409, "the session is not finished"))
    })?;
    let bytes = tokio::task::spawn_blocking(move || file.read())
        .await
        .map_err(|_| ApiError::new(500, "capture file"))?
        .map_err(|e| ApiError::new(500, format!("capture file: {e}")))?;
    // The session ends with its capture delivered.
    *lock(&st.session) = None;
    let mut r = (StatusCode::OK, Bytes::from(bytes)).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.tcpdump.pcap"),
    );
    Ok(r)
}

async fn not_found() -> ApiError {
    ApiError::new(404, "no such endpoint")
}

fn router(st: St) -> Router {
    Router::new()
        .route("/v1/clock", get(clock))
        .route("/v1/session", post(open))
        .route("/v1/session/{id}/sockets", get(sockets))
        .route("/v1/session/{id}/finish", post(finish))
        .route("/v1/session/{id}/pcap", get(pcap))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(st.clone(), gate))
        .with_state(st)
}

/// Connections open at once, all peers together (each is also bounded in time).
const MAX_CONNECTIONS: usize = 512;
/// Connections open at once from one peer address.
const PER_PEER: usize = 16;
/// Connections without an authenticated request yet, kept at once: a new connection beyond
/// them closes the oldest (a flood of idle or slow connections cannot hold the slots a
/// caller with the token needs: its connection is new too until its first request).
const MAX_UNAUTHENTICATED: usize = 384;
/// How long a connection may stay open without an authenticated request (its TLS
/// handshake and its first request's headers included).
const UNAUTHENTICATED_LIFE: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// One connection as the admission sees it.
struct Conn {
    id: u64,
    peer: IpAddr,
    /// Whether a request on it carried the token: then it is never evicted.
    authenticated: AtomicBool,
    /// Told to close (evicted for a newer connection).
    evict: tokio::sync::Notify,
}

/// The open connections: per peer, and the unauthenticated ones oldest first.
#[derive(Default)]
struct Conns {
    next: u64,
    total: usize,
    per_peer: std::collections::HashMap<IpAddr, usize>,
    unauthenticated: std::collections::VecDeque<Arc<Conn>>,
}

impl Conns {
    /// Admits a connection from `peer`, evicting the oldest unauthenticated connection (of
    /// that peer when the peer is at its limit) to make room; `None`: refused (every
    /// connection in the way has authenticated).
    fn admit(&mut self, peer: IpAddr) -> Option<Arc<Conn>> {
        if self.per_peer.get(&peer).copied().unwrap_or(0) >= PER_PEER
            && !self.evict_oldest(Some(peer))
        {
            return None;
        }
        if (self.total >= MAX_CONNECTIONS || self.unauthenticated.len() >= MAX_UNAUTHENTICATED)
            && !self.evict_oldest(None)
        {
            return None;
        }
        self.next += 1;
        let c = Arc::new(Conn {
            id: self.next,
            peer,
            authenticated: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
        });
        self.total += 1;
        *self.per_peer.entry(peer).or_default() += 1;
        self.unauthenticated.push_back(c.clone());
        Some(c)
    }

    /// Evicts the oldest unauthenticated connection of `peer`, or, without one, of the peer
    /// holding the most unauthenticated connections (a flood loses its own first: a caller
    /// with one connection in the handshake keeps it); whether one was. It leaves the
    /// unauthenticated list now and the counts when its task ends.
    fn evict_oldest(&mut self, peer: Option<IpAddr>) -> bool {
        let peer = peer.or_else(|| {
            let mut n: std::collections::HashMap<IpAddr, usize> = Default::default();
            for c in &self.unauthenticated {
                *n.entry(c.peer).or_default() += 1;
            }
            // The most, and of those the one whose oldest is oldest (the list's order).
            let most = n.values().copied().max()?;
            self.unauthenticated
                .iter()
                .find(|c| n.get(&c.peer) == Some(&most))
                .map(|c| c.peer)
        });
        let Some(i) = self
            .unauthenticated
            .iter()
            .position(|c| peer.is_none_or(|p| c.peer == p))
        else {
            return false;
        };
        if let Some(c) = self.unauthenticated.remove(i) {
            c.evict.notify_one();
        }
        true
    }

    /// `c` carried the token: off the unauthenticated list for good.
    fn authenticated(&mut self, c: &Conn) {
        if !c.authenticated.swap(true, Ordering::Relaxed) {
            self.unauthenticated.retain(|u| u.id != c.id);
        }
    }

    /// `c` closed.
    fn closed(&mut self, c: &Conn) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_peer.get_mut(&c.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_peer.remove(&c.peer);
            }
        }
        self.unauthenticated.retain(|u| u.id != c.id);
    }
}

/// Serves on `listener` until `stop` is set. Each connection: a 5 s TLS handshake, 5 s for
/// a request's headers (at most 16 KiB) and 5 s for its body, an authenticated request
/// within 10 s, and at most the longest window plus its grace and a minute in all; at most
/// 16 from one address, and a new connection closes the oldest unauthenticated one when
/// the slots are full.
pub fn serve(
    cfg: AgentConfig,
    tls: Arc<rustls::ServerConfig>,
    listener: std::net::TcpListener,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(accept_loop(cfg, tls, listener, stop))
}

async fn accept_loop(
    cfg: AgentConfig,
    tls: Arc<rustls::ServerConfig>,
    listener: std::net::TcpListener,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let life = cfg.max_window + cfg.grace + Duration::from_secs(60);
    let st: St = Arc::new(Shared {
        bucket: Mutex::new(Bucket::new(cfg.burst, cfg.rate_per_sec)),
        refusals: Mutex::new(Bucket::new(cfg.burst, cfg.rate_per_sec)),
        session: Mutex::new(None),
        ended: Mutex::new(None),
        conns: Mutex::new(Conns::default()),
        cfg,
    });
    let app = router(st.clone());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    while !stop.load(Ordering::Relaxed) {
        let (tcp, peer) =
            match tokio::time::timeout(Duration::from_millis(200), listener.accept()).await {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => {
                    log::warn!("agent: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(_) => continue,
            };
        let Some(c) = lock(&st.conns).admit(peer.ip()) else {
            drop(tcp);
            continue;
        };
        let (acceptor, app, st) = (acceptor.clone(), app.clone(), st.clone());
        tokio::spawn(async move {
            let serve = async {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await
                else {
                    return;
                };
                let conn_id = c.clone();
                let svc = hyper::service::service_fn(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(ConnectInfo(peer));
                        req.extensions_mut().insert(conn_id.clone());
                        let app = app.clone();
                        async move {
                            use tower::ServiceExt;
                            app.oneshot(req.map(Body::new)).await
                        }
                    },
                );
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(5))
                    .max_buf_size(16 * 1024)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                let _ = tokio::time::timeout(life, conn).await;
            };
            // Unauthenticated for too long: closed (an authenticated one runs its course).
            let unauthenticated_life = async {
                tokio::time::sleep(UNAUTHENTICATED_LIFE).await;
                if c.authenticated.load(Ordering::Relaxed) {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = serve => {}
                () = c.evict.notified() => {}
                () = unauthenticated_life => {}
            }
            lock(&st.conns).closed(&c);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn the_capture_takes_only_the_listener_that_serves_the_caller() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let peer = ip(9);
        // One wildcard listener: any local address.
        let one = [sa("0.0.0.0:80")];
        assert_eq!(local_end_of(&one, Dest::From(peer), 80), LocalEnd::Any);
        assert_eq!(
            capture_filter(peer, 80, &LocalEnd::Any),
            "tcp and ((src host 10.0.0.9 and dst port 80) or (dst host 10.0.0.9 and src port 80))"
        );
        // The server on one address, another process on another and on loopback.
        let two = [
            sa("10.0.0.1:80"),
            sa("10.0.0.3:80"),
            sa("127.0.0.1:80"),
            sa("10.0.0.1:22"),
        ];
        let e = local_end_of(&two, Dest::From(peer), 80);
        assert_eq!(
            e,
            LocalEnd::Only(vec![ip(1), ip(3)]),
            "both could serve the caller"
        );
        // A wildcard beside a specific address (SO_REUSEPORT, or v6only): the other's is left out.
        let wild = [sa("0.0.0.0:80"), sa("10.0.0.3:80")];
        let e = local_end_of(&wild, Dest::From(peer), 80);
        assert_eq!(e, LocalEnd::Only(vec![ip(3)]));
        let e = LocalEnd::Not(vec![ip(3)]);
        assert_eq!(
            capture_filter(peer, 80, &e),
            "tcp and ((src host 10.0.0.9 and dst port 80 and not (dst host 10.0.0.3)) or \
             (dst host 10.0.0.9 and src port 80 and not (src host 10.0.0.3)))"
        );
        assert_eq!(local_end_of(&[], Dest::From(peer), 80), LocalEnd::Any);
        // The caller named the address it connects to: that listener alone, and beside a
        // wildcard, the wildcard's is every address but the other listeners'.
        let to = |n| Dest::To(ip(n));
        assert_eq!(local_end_of(&two, to(1), 80), LocalEnd::Only(vec![ip(1)]));
        assert_eq!(local_end_of(&wild, to(1), 80), LocalEnd::Not(vec![ip(3)]));
        assert_eq!(local_end_of(&wild, to(3), 80), LocalEnd::Only(vec![ip(3)]));
    }

    #[test]
    fn a_flood_evicts_its_own_connections_first_and_never_an_authenticated_one() {
        let mut c = Conns::default();
        // The caller with the token: one connection, authenticated.
        let caller = c.admit(ip(1)).unwrap();
        c.authenticated(&caller);
        // One address at its limit: its own oldest goes for its next.
        let first: Vec<_> = (0..PER_PEER).map(|_| c.admit(ip(2)).unwrap()).collect();
        let next = c.admit(ip(2)).unwrap();
        assert_eq!(c.unauthenticated.len(), PER_PEER);
        assert!(!c.unauthenticated.iter().any(|u| u.id == first[0].id));
        assert!(c.unauthenticated.iter().any(|u| u.id == next.id));
        // Many addresses fill the unauthenticated slots; a new peer's connection (a caller
        // in its handshake) gets in, and evictions fall on the peers holding the most.
        for n in 3..100u8 {
            for _ in 0..4 {
                c.admit(ip(n)).unwrap();
            }
        }
        assert!(c.unauthenticated.len() <= MAX_UNAUTHENTICATED);
        let newcomer = c.admit(ip(200)).unwrap();
        for n in 100..200u8 {
            for _ in 0..4 {
                c.admit(ip(n)).unwrap();
            }
        }
        assert!(c.unauthenticated.iter().any(|u| u.id == newcomer.id));
        assert!(c.unauthenticated.len() <= MAX_UNAUTHENTICATED);
        // The authenticated connection was never on the list to evict.
        assert!(!c.unauthenticated.iter().any(|u| u.id == caller.id));
        // Closing gives the slot back.
        let before = c.total;
        c.closed(&newcomer);
        assert_eq!(c.total, before - 1);
        assert!(!c.unauthenticated.iter().any(|u| u.id == newcomer.id));
    }

    #[test]
    fn with_every_slot_authenticated_a_new_connection_is_refused() {
        let mut c = Conns::default();
        for n in 0..MAX_CONNECTIONS {
            let x = c
                .admit(IpAddr::from([10, 1, (n / 200) as u8, (n % 200) as u8]))
                .unwrap();
            c.authenticated(&x);
        }
        assert!(c.admit(ip(9)).is_none());
    }
}
