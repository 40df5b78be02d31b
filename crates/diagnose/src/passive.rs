//! `diagnose --passive` and `--pcap`: the verdict from real clients' traffic, sending no
//! request at all.
//!
//! The app layer's run is built from the transactions the capture saw: each one becomes a
//! per-request record (connect from the handshake, request, server time, response), its
//! wait from the request's first byte (the SYN for a connection's first request) to the
//! response's last byte as the capture saw it. The packet analyzer keeps them in bounded
//! memory (every wait in HdrHistograms, the slowest exactly, a uniform sample of the rest:
//! `AnalyzeOptions::timing_keep`), so the rules read a passive run as they read a load run,
//! and the records join their own transactions (θ = 0: one clock).
//!
//! Live (`--passive`): the capture runs in the server's namespace (or on an interface of
//! this one) and feeds the analyzer as packets arrive; the sockets and host layers read the
//! server over the same window. `--pcap FILE`: packets only; the other layers say why not.
//! The path layer never runs: a probe would be a request of our own.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lagtrace_model::analyze::{Analysis, TxnTiming};
use lagtrace_model::diagnosis::evidence::HopEvidence;
use lagtrace_model::{RequestRecord, RequestRecords};
use lagtrace_netns::NetNs;
use lagtrace_packet::analysis::KeepCaps;
use lagtrace_packet::{AnalyzeOptions, Analyzer};

use crate::adapters;
use crate::error::{Error, Result};
use crate::evidence::{
    AppEvidence, AppRun, Layer, Layers, PacketEvidence, PassiveRun, PercentilePoint,
    SocketEvidence, Target,
};
use crate::run::{INTERRUPTED, ServerLocation, Step, Timings};
use crate::{Assemble, Diagnosis, Settings};

/// Default window of `--passive`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// Where the clients' traffic comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A live capture: in namespace `netns` (None: this one) on `iface` (None: the
    /// interface toward the clients, else `any`), for `window`.
    Live {
        /// The server's network namespace (under /run/netns).
        netns: Option<String>,
        /// The interface to capture on.
        iface: Option<String>,
        /// How long to watch.
        window: Duration,
    },
    /// A saved capture (pcap or pcapng).
    File(PathBuf),
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct PassiveOptions {
    /// The capture.
    pub source: Source,
    /// The server's TCP port.
    pub port: u16,
    /// The server's address, when known (a URL's host): only its traffic counts.
    pub addr: Option<IpAddr>,
    /// The URL the user gave, if any (for the report).
    pub url: Option<String>,
    /// Ctrl-C: ends the window early; the verdict so far is marked partial.
    pub stop: Arc<AtomicBool>,
    /// The server's process for the host layer (default: the listener's owner on `port`).
    pub server_pid: Option<u32>,
    /// Do not follow the connections the server opens (`--no-hops`; live only: a saved
    /// capture's hops are whatever it holds).
    pub no_hops: bool,
}

/// What passive mode cannot tell, said on the app layer.
const NO_CONTRAST: &str = "passive: real clients' requests as the capture saw them; no \
    sequential (c=1) run to contrast with, so the rules that compare one client alone with \
    many (queueing under load, the server's own time at c=1) read the packets instead";

/// The analyzer's options for a passive capture.
pub(crate) fn analyze_options() -> AnalyzeOptions {
    AnalyzeOptions {
        timings: true,
        timing_keep: Some(KeepCaps::default()),
        // Detail lists stay bounded too (the counts cover everything).
        max_transactions: 20_000,
        max_findings: 50_000,
        ..AnalyzeOptions::default()
    }
}

/// Whether a segment belongs to the server at `port` (and `addr`, when given).
fn ours(linktype: u32, data: &[u8], port: u16, addr: Option<IpAddr>) -> bool {
    match lagtrace_packet::wire::decode(linktype, data) {
        Ok(s) => {
            let at = |ip: IpAddr, p: u16| {
                p == port && addr.is_none_or(|a| a.to_canonical() == ip.to_canonical())
            };
            at(s.dst, s.dport) || at(s.src, s.sport)
        }
        // Not TCP: the analyzer counts it as such.
        Err(_) => true,
    }
}

/// Runs the passive diagnosis. `Err` only when it cannot start (bad options, unreadable
/// file); what the layers measured, failures included, is in the [`Diagnosis`].
pub fn run(opts: &PassiveOptions, progress: &dyn Fn(Step)) -> Result<Diagnosis> {
    let t0 = Instant::now();
    if opts.port == 0 {
        return Err(Error::Usage("--port must be 1..65535".into()));
    }
    let (layers, window) = match &opts.source {
        Source::File(p) => (from_file(opts, p, progress)?, Duration::ZERO),
        Source::Live {
            netns,
            iface,
            window,
        } => {
            if *window < Duration::from_millis(500) || *window > crate::run::MAX_DURATION {
                return Err(Error::Usage(format!(
                    "the window must be 500ms..{} s",
                    crate::run::MAX_DURATION.as_secs()
                )));
            }
            let loc = match netns {
                Some(n) => ServerLocation::Namespace(n.clone()),
                None => ServerLocation::Here,
            };
            (
                live(opts, &loc, iface.as_deref(), *window, progress)?,
                *window,
            )
        }
    };
    // No request seen is no verdict: neither healthy nor a cause can be read from silence.
    if layers.app.get().is_none() && !opts.stop.load(Ordering::Relaxed) {
        return Err(Error::Target(
            format!(
                "no complete request to port {} {}: {} (wrong port, address or interface, or no \
             client traffic{})",
                opts.port,
                match &opts.source {
                    Source::File(p) => format!("in {}", p.display()),
                    Source::Live { window, .. } => format!("in {:.0} s", window.as_secs_f64()),
                },
                crate::run::packets_line(&layers.packets),
                if matches!(opts.source, Source::Live { .. }) {
                    " in the window"
                } else {
                    ""
                }
            ) + &layers
                .packets
                .get()
                .map(|p| {
                    p.limits
                        .iter()
                        .map(|l| format!("; {l}"))
                        .collect::<String>()
                })
                .unwrap_or_default(),
        ));
    }
    Ok(assemble(opts, layers, window, t0))
}

/// The target as the report names it.
fn target(opts: &PassiveOptions, layers: &Layers) -> Target {
    let seen = layers
        .app
        .get()
        .and_then(|a| a.cn.as_ref())
        .and_then(|r| r.passive.as_ref())
        .and_then(|p| p.server.parse::<SocketAddr>().ok())
        .map(|sa| sa.ip().to_string());
    let addr = opts
        .addr
        .map(|a| a.to_string())
        .or(seen)
        .unwrap_or_default();
    let url = opts.url.clone().unwrap_or_else(|| match &opts.source {
        Source::File(p) => format!("pcap:{}#port={}", p.display(), opts.port),
        Source::Live { netns, iface, .. } => format!(
            "passive:{}{}:{}",
            netns
                .as_deref()
                .map(|n| format!("netns={n},"))
                .unwrap_or_default(),
            iface.as_deref().unwrap_or("any"),
            opts.port
        ),
    });
    Target {
        url,
        host: addr.clone(),
        addr,
        port: opts.port,
    }
}

fn assemble(opts: &PassiveOptions, layers: Layers, window: Duration, t0: Instant) -> Diagnosis {
    let concurrency = layers
        .app
        .get()
        .and_then(|a| a.cn.as_ref())
        .map_or(0, |r| r.concurrency);
    let settings = Settings {
        concurrency,
        duration_us: window.as_micros() as u64,
    };
    let elapsed = t0.elapsed();
    let mut d = Diagnosis::assemble(
        target(opts, &layers),
        settings,
        layers,
        elapsed.as_micros() as u64,
    );
    d.started_unix_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |n| n.saturating_sub(elapsed).as_micros() as u64);
    if opts.stop.load(Ordering::Relaxed) {
        crate::partial::mark(d)
    } else {
        d
    }
}

/// The layers of a saved capture: packets and the passive run only.
fn from_file(opts: &PassiveOptions, path: &Path, progress: &dyn Fn(Step)) -> Result<Layers> {
    progress(Step::Start(format!(
        "packets: reading {} (port {})",
        path.display(),
        opts.port
    )));
    // The first stretch whole: the hops' exchanges are placed among all its requests.
    let (a, snap) = analyze_path(path, opts, crate::pcap_hops::analyze_options())?;
    let point = format!("file {}", path.display());
    let (app, mut packets, of_record) =
        layers_of(&a, point.clone(), 0, opts.stop.load(Ordering::Relaxed));
    if let Some(ev) = packets.data.as_mut()
        && let Some(l) = snap.limit(&a)
    {
        ev.limits.push(l);
    }
    // Second pass, keeping the example stream's packets for its flow.
    if let Some(ev) = packets.data.as_mut()
        && let Some(s) = adapters::packets::example_stream(&a, u64::MAX)
    {
        let o2 = AnalyzeOptions {
            keep_stream: Some(s),
            ..AnalyzeOptions::default()
        };
        if let Ok((a2, _)) = analyze_path(path, opts, o2) {
            ev.example_flow = adapters::packets::flow(&a2, s, 14);
        }
    }
    progress(Step::Done(crate::run::packets_line(&packets)));
    let why = |what: &str| {
        format!("--pcap: a saved capture has no {what}; run --passive on the server's host for it")
    };
    // The server's own connections, where the capture holds them too.
    let (mut hops, hop_timed) = crate::pcap_hops::find(path, opts.port, opts.addr, &a, &opts.stop);
    join_hops(&mut packets, &a, &of_record, &mut hops, &hop_timed);
    Ok(Layers {
        path: Layer::skipped(
            "passive: no probe is sent (the handshake RTT in the packets stands for the path)",
        ),
        app,
        packets,
        sockets: Layer::skipped(why("server sockets")),
        host: Layer::skipped(why("host counters")),
        hops,
    })
}

/// Frames of a file shorter than on the wire: the capture's snap length.
#[derive(Default)]
struct Snapped {
    frames: u64,
    kept: usize,
}

impl Snapped {
    /// The line saying what the snap length hid, when it cut most responses before their
    /// status line: an error response cannot then be told from an answer, so a quiet
    /// capture clears nothing. (Timings read the IP and TCP headers only.)
    fn limit(&self, a: &Analysis) -> Option<String> {
        let answered = a.transactions.iter().filter(|t| t.response_bytes > 0);
        let (n, blind) = answered.fold((0, 0), |(n, b), t| {
            (n + 1, b + usize::from(t.status.is_none()))
        });
        (self.frames > 0 && n > 0 && blind * 2 > n).then(|| {
            format!(
                "the capture is incomplete: its snap length cut {} frames at {} bytes, before the status line of {blind} of {n} responses: error responses cannot be told from answers",
                self.frames, self.kept
            )
        })
    }
}

/// Reads `path`, analysing the frames of the server's port only (frame numbers stay the
/// file's), and counting the frames its snap length cut.
fn analyze_path(
    path: &Path,
    opts: &PassiveOptions,
    o: AnalyzeOptions,
) -> Result<(Analysis, Snapped)> {
    use lagtrace_packet::{CaptureReader, ReadEvent};
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Usage(format!("--pcap {}: {e}", path.display())))?;
    let mut reader = CaptureReader::new(std::io::BufReader::new(f))
        .map_err(|e| Error::Usage(format!("--pcap {}: {e}", path.display())))?;
    let mut an = Analyzer::new(o);
    let mut snap = Snapped::default();
    while let Some(ev) = reader.next() {
        if opts.stop.load(Ordering::Relaxed) {
            break;
        }
        match ev {
            ReadEvent::Frame(f) if ours(f.linktype, f.data, opts.port, opts.addr) => {
                if f.data.len() < f.len as usize {
                    snap.frames += 1;
                    snap.kept = snap.kept.max(f.data.len());
                }
                an.push_frame(&f)
            }
            ReadEvent::Frame(_) => an.push_skipped(),
            ReadEvent::Warning(w) => an.warn(w),
        }
    }
    Ok((an.finish(), snap))
}

/// The app and packet layers of a finished analysis, and per kept record (in the order of
/// the packet layer's join) the timing it was matched to.
fn layers_of(
    a: &Analysis,
    point: String,
    dropped: u64,
    cut: bool,
) -> (
    Layer<AppEvidence>,
    Layer<PacketEvidence>,
    Vec<Option<usize>>,
) {
    let mut ev = adapters::packets::evidence(a, point.clone(), dropped, false);
    let run = passive_run(a, point);
    let mut of_record = Vec::new();
    if let Some(records) = &run.records
        && !a.timings.is_empty()
    {
        let j = crate::join::join(records, a.first_ts_ns, &a.timings);
        of_record = j.requests.iter().map(|r| r.timing).collect();
        ev.joins.push(j.evidence(run.concurrency));
    }
    let packets = if a.frames == 0 {
        let mut l = Layer::ran(ev);
        l.reason = Some("no packet captured".into());
        l
    } else {
        Layer::ran(ev)
    };
    let app = if run.requests == 0 {
        Layer::error(if cut {
            INTERRUPTED.to_string()
        } else {
            "passive: no complete request in the capture (no client traffic in the window, \
             or the wrong port or interface)"
                .to_string()
        })
    } else {
        let mut l = Layer::ran(AppEvidence {
            c1: None,
            cn: Some(run),
        });
        l.reason = Some(NO_CONTRAST.into());
        l
    };
    (app, packets, of_record)
}

/// The hops' exchanges joined with the server's transactions in front of them, as a live
/// run joins them ([`crate::run::join_upstreams`]): the server's own time told from its
/// hops' per request.
fn join_hops(
    packets: &mut Layer<PacketEvidence>,
    a: &Analysis,
    of_record: &[Option<usize>],
    hops: &mut [HopEvidence],
    hop_timed: &[Option<Timings>],
) {
    let front = crate::join::upstream::Timed {
        base_us: a.first_ts_ns / 1000,
        timings: &a.timings,
    };
    crate::run::join_upstreams(packets, front, of_record, hops, hop_timed);
}

/// µs since the capture's first packet as a record time (times before it clamp to 0).
fn at(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// One capture transaction as a per-request record, on the capture's clock.
fn record(t: &TxnTiming, end_us: u64) -> RequestRecord {
    let opened = t.index == 0 && t.syn_at_us.is_some();
    let start = if opened {
        t.syn_at_us
    } else {
        t.request_first_at_us
    }
    .map_or(0, at);
    let wait = lagtrace_packet::analysis::wait_us(t);
    let connect_start = t.syn_at_us.filter(|_| opened).map_or(start, at);
    RequestRecord {
        conn: u64::from(t.stream),
        local: Some(t.client),
        remote: t.server,
        index: t.index,
        start_us: start,
        wait_us: wait.unwrap_or(end_us.saturating_sub(start)),
        connect_start_us: connect_start,
        // The handshake completes at the client when the SYN-ACK reaches it.
        connect_end_us: Some(if opened {
            t.synack_at_us.map_or(connect_start, at)
        } else {
            connect_start
        }),
        syn_retransmits: opened.then_some(t.syn_retransmits),
        intended_us: None,
        sent_first_us: t.request_first_at_us.map(at),
        sent_last_us: t.request_last_at_us.map(at),
        first_byte_us: t.response_first_at_us.map(at),
        last_byte_us: t.response_last_at_us.map(at),
        bytes: 0,
        status: None,
        error: None,
        pending: wait.is_none(),
        slow: t.weight == 1.0,
        weight: t.weight,
    }
}

/// The passive run: the capture's transactions as a load run's figures and records.
pub fn passive_run(a: &Analysis, source: String) -> AppRun {
    let Some(keep) = &a.timing_keep else {
        return AppRun::default();
    };
    let mut records: Vec<RequestRecord> =
        a.timings.iter().map(|t| record(t, a.duration_us)).collect();
    records.sort_by_key(|r| (r.start_us, r.conn, r.index));
    let all = RequestRecords {
        start_unix_us: u64::try_from(a.first_ts_ns / 1000).unwrap_or(0),
        threads: 1,
        slow_cap: keep.slow_cap,
        sample_cap: keep.sample_cap,
        seen: keep.seen,
        pending: keep.incomplete,
        records,
    };
    let by_client = by_client(&all.records);
    let served: Vec<_> = a.streams.iter().filter(|s| s.transactions > 0).collect();
    let mut clients: Vec<IpAddr> = served
        .iter()
        .map(|s| if s.a_is_client { s.a.ip() } else { s.b.ip() })
        .collect();
    clients.sort_unstable();
    clients.dedup();
    let mut by_server: std::collections::HashMap<SocketAddr, u64> = Default::default();
    for s in &served {
        *by_server
            .entry(if s.a_is_client { s.b } else { s.a })
            .or_default() += s.transactions;
    }
    let server = by_server
        .into_iter()
        .max_by_key(|&(a, n)| (n, std::cmp::Reverse(a)))
        .map(|(a, _)| a.to_string())
        .unwrap_or_default();
    let bytes = served
        .iter()
        .map(|s| {
            if s.a_is_client {
                s.payload_ba
            } else {
                s.payload_ab
            }
        })
        .sum();
    let secs = (a.duration_us as f64 / 1e6).max(1e-6);
    let some = |p: &crate::evidence::Percentiles| (p.count > 0).then(|| p.clone());
    AppRun {
        concurrency: u32::try_from(served.len()).unwrap_or(u32::MAX),
        requests: keep.waits.count,
        duration_us: a.duration_us,
        requests_per_sec: keep.waits.count as f64 / secs,
        latency: keep.waits.clone(),
        distribution: keep
            .distribution
            .iter()
            .map(|&(percentile, latency_us)| PercentilePoint {
                percentile,
                latency_us,
            })
            .collect(),
        errors: Default::default(),
        first_request: some(&keep.first),
        bytes,
        later_requests: some(&keep.later),
        waits: Some(keep.waits.clone()),
        connects: Some(adapters::app::connects(&all.records)),
        records: Some(adapters::app::trim(&all, keep.waits.p99_us)),
        client_cpu: None,
        passive: Some(PassiveRun {
            source,
            server,
            clients: clients.len() as u64,
            connections: served.len() as u64,
            incomplete: keep.incomplete,
            by_client,
            joined_open: served
                .iter()
                .filter(|s| s.syn_a.is_none() && s.syn_b.is_none())
                .count() as u64,
        }),
    }
}

/// Per client address, when there are several: the 16 with the most requests, each with
/// its weighted p50 and p99 over the kept records.
fn by_client(records: &[RequestRecord]) -> Vec<crate::evidence::ClientWaits> {
    let mut m: std::collections::HashMap<IpAddr, Vec<&RequestRecord>> = Default::default();
    for r in records.iter().filter(|r| !r.pending) {
        if let Some(l) = r.local {
            m.entry(l.ip().to_canonical()).or_default().push(r);
        }
    }
    if m.len() < 2 {
        return Vec::new();
    }
    let mut v: Vec<crate::evidence::ClientWaits> = m
        .into_iter()
        .map(|(ip, rs)| {
            let p = adapters::app::waits(&rs.into_iter().cloned().collect::<Vec<_>>());
            crate::evidence::ClientWaits {
                addr: ip.to_string(),
                requests: p.count,
                p50_us: p.p50_us,
                p99_us: p.p99_us,
            }
        })
        .collect();
    v.sort_by(|a, b| b.requests.cmp(&a.requests).then(a.addr.cmp(&b.addr)));
    v.truncate(16);
    v
}

/// The live capture feeding the analyzer.
struct Live {
    handle: lagtrace_packet::capture::CaptureHandle,
    analyzer: Arc<Mutex<Option<Analyzer>>>,
    point: String,
}

fn start_live(
    loc: &ServerLocation,
    iface: Option<&str>,
    opts: &PassiveOptions,
    analysis: AnalyzeOptions,
) -> std::result::Result<Live, String> {
    use lagtrace_packet::capture::{Capture, CaptureOptions, PacketCallback};
    let (netns, label) = match loc {
        ServerLocation::Namespace(n) => (NetNs::Named(n.clone()), format!("namespace {n}")),
        _ => (NetNs::Current, "this namespace".to_string()),
    };
    let iface = iface.unwrap_or("any").to_string();
    let mut filter = format!("tcp port {}", opts.port);
    if let Some(a) = opts.addr {
        filter.push_str(&format!(" and host {a}"));
    }
    let o = CaptureOptions {
        iface: iface.clone(),
        filter: Some(filter),
        snaplen: 160,
        netns,
        // 64 MiB: a busy server's bursts wait in the kernel while the analyzer catches up.
        buffer_bytes: 64 << 20,
        ..CaptureOptions::default()
    };
    let analyzer = Arc::new(Mutex::new(Some(Analyzer::new(analysis))));
    let feed = analyzer.clone();
    let cb: PacketCallback = Box::new(move |p| {
        if let Some(an) = feed.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            an.push(
                i64::try_from(p.ts_ns).unwrap_or(i64::MAX),
                p.orig_len,
                p.linktype,
                p.data,
            );
        }
    });
    let point = format!("{iface} in {label}");
    match Capture::start(&o, Some(cb)) {
        Ok(handle) => Ok(Live {
            handle,
            analyzer,
            point,
        }),
        Err(e) => Err(format!("capture on {point}: {e}")),
    }
}

/// The live layers: capture (analysed as it runs), sockets and host over the window.
fn live(
    opts: &PassiveOptions,
    loc: &ServerLocation,
    iface: Option<&str>,
    window: Duration,
    progress: &dyn Fn(Step),
) -> Result<Layers> {
    let stop = &*opts.stop;
    let dest = opts
        .addr
        .map_or(crate::run::Dest::Any, crate::run::Dest::To);
    // The server's own connections (its upstreams), found from its sockets and captured
    // from the window's start, as a live run's: the front then keeps its first stretch of
    // transactions whole for the per-request join.
    let discovery = (!opts.no_hops)
        .then(|| crate::hops::Discovery::start(loc, dest, opts.port))
        .flatten();
    let analysis = match &discovery {
        Some(_) => crate::pcap_hops::analyze_options(),
        None => analyze_options(),
    };
    let cap = start_live(loc, iface, opts, analysis).map_err(Error::Target)?;
    let hop_caps = discovery
        .as_ref()
        .map(crate::hops::Discovery::start_captures);
    progress(Step::Start(format!(
        "passive: watching port {} on {} for {:.0} s (no request is sent)",
        opts.port,
        cap.point,
        window.as_secs_f64()
    )));
    let host = {
        let (loc, port, pid) = (loc.clone(), opts.port, opts.server_pid);
        let ipv6 = opts.addr.is_some_and(|a| a.is_ipv6());
        let dest = opts
            .addr
            .map_or(crate::run::Dest::Any, crate::run::Dest::To);
        std::thread::spawn(move || adapters::host::measure(&loc, dest, port, ipv6, pid, window))
    };
    let insp: Arc<Mutex<Option<Layer<SocketEvidence>>>> = Arc::new(Mutex::new(None));
    let inspector = {
        let (loc, insp, port, stop) = (loc.clone(), insp.clone(), opts.port, opts.stop.clone());
        let dest = opts
            .addr
            .map_or(crate::run::Dest::Any, crate::run::Dest::To);
        // Midway: the clients' connections are established by then.
        let at = (window / 2).min(Duration::from_secs(5));
        std::thread::spawn(move || {
            let l = if crate::run::nap(at, &stop) {
                Layer::skipped(INTERRUPTED)
            } else {
                crate::run::inspect_server(&loc, dest, port)
            };
            *insp.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
        })
    };
    watch(&cap, window, stop, progress);
    let stats = cap.handle.stop();
    let an = cap
        .analyzer
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let (dropped, note) = match &stats {
        Ok(s) => (s.dropped_by_kernel + s.dropped_by_interface, None),
        Err(e) => (0, Some(format!("capture: {e:#}"))),
    };
    let a = an.map(Analyzer::finish);
    let cut = stop.load(Ordering::Relaxed);
    let (app, mut packets, of_record) = match &a {
        Some(a) => layers_of(a, cap.point.clone(), dropped, cut),
        None => (
            Layer::error("the capture's analyzer was lost"),
            Layer::error("the capture's analyzer was lost"),
            Vec::new(),
        ),
    };
    let (mut hops, hop_timed) = match (discovery, hop_caps) {
        (Some(d), Some(c)) => d.finish(c, a.is_some()),
        _ => Default::default(),
    };
    if let Some(a) = &a {
        join_hops(&mut packets, a, &of_record, &mut hops, &hop_timed);
    }
    if dropped > 0 || note.is_some() {
        let n = note.unwrap_or_else(|| {
            format!("the kernel dropped {dropped} packets from the capture: the figures miss them")
        });
        packets.reason = Some(n);
    }
    progress(Step::Done(crate::run::packets_line(&packets)));
    for h in &hops {
        progress(Step::Done(crate::run::hop_line(h)));
    }
    let _ = inspector.join();
    let mut sockets = insp
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_else(|| Layer::error("the inspection thread did not finish"));
    if let Some(s) = sockets.data.as_mut() {
        s.client.note = "passive: the clients are real clients, not lagtrace; their socket \
                         options are not read (their delayed ACKs show in the packets)"
            .into();
    }
    progress(Step::Done(crate::run::sockets_line(&sockets)));
    let host = if cut {
        Layer::skipped(format!("{INTERRUPTED} before its window closed"))
    } else {
        host.join()
            .unwrap_or_else(|_| Layer::error("the host layer's thread panicked"))
    };
    progress(Step::Done(format!("host: {}", host.status.name())));
    Ok(Layers {
        path: Layer::skipped(
            "passive: no probe is sent (the handshake RTT in the packets stands for the path)",
        ),
        app,
        packets,
        sockets,
        host,
        hops,
    })
}

/// Waits out the window (or Ctrl-C), with a progress line of live counts every second.
fn watch(cap: &Live, window: Duration, stop: &AtomicBool, progress: &dyn Fn(Step)) {
    let t0 = Instant::now();
    loop {
        let left = window.saturating_sub(t0.elapsed());
        if left.is_zero() || crate::run::nap(left.min(Duration::from_secs(1)), stop) {
            return;
        }
        let (frames, txns, streams, live) = cap
            .analyzer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or((0, 0, 0, 0), |a| {
                (a.frames(), a.transactions(), a.streams(), a.live_streams())
            });
        progress(Step::Progress(format!(
            "passive: {:>3.0}/{:.0} s  {frames} packets  {txns} requests  {streams} connections \
             ({live} open)",
            t0.elapsed().as_secs_f64(),
            window.as_secs_f64()
        )));
    }
}

/// The server's address and port from a URL (`http://host:port/`), for `--passive URL`.
pub fn from_url(url: &str) -> Result<(SocketAddr, String)> {
    let (_, sa) = crate::run::parse_target(url)?;
    Ok((sa, url.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(client: &str, wait_us: u64, weight: f64) -> RequestRecord {
        RequestRecord {
            conn: 0,
            local: Some(client.parse().unwrap()),
            remote: "10.0.0.2:80".parse().unwrap(),
            index: 1,
            start_us: 0,
            wait_us,
            connect_start_us: 0,
            connect_end_us: Some(0),
            syn_retransmits: None,
            intended_us: None,
            sent_first_us: Some(0),
            sent_last_us: Some(0),
            first_byte_us: Some(wait_us),
            last_byte_us: Some(wait_us),
            bytes: 0,
            status: None,
            error: None,
            pending: false,
            slow: weight == 1.0,
            weight,
        }
    }

    #[test]
    fn clients_that_differ_are_told_apart_and_one_client_is_no_breakdown() {
        let mut r: Vec<RequestRecord> = (0..99).map(|_| rec("10.0.0.1:4000", 500, 10.0)).collect();
        r.push(rec("10.0.0.1:4001", 900, 1.0));
        assert!(by_client(&r).is_empty());
        // A second client whose every request waits 200 ms.
        r.extend((0..20).map(|_| rec("10.0.0.9:5000", 200_000, 1.0)));
        let v = by_client(&r);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].addr.as_str(), v[0].requests, v[0].p50_us),
            ("10.0.0.1", 991, 500)
        );
        assert_eq!(
            (v[1].addr.as_str(), v[1].requests, v[1].p99_us),
            ("10.0.0.9", 20, 200_000)
        );
    }
}
