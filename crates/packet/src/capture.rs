//! Live capture with libpcap, in any network namespace, on its own thread.
//!
//! ```ignore
//! let (handle, rx) = Capture::start_channel(&CaptureOptions {
//!     iface: "veth0".into(),
//!     filter: Some("tcp port 8080".into()),
//!     ..CaptureOptions::default()
//! })?;
//! // ... generate traffic ...
//! let stats = handle.stop()?;           // prompt; drains what the kernel already holds
//! let packets: Vec<CapturedPacket> = rx.try_iter().collect();
//! // Or stream into the analyzer without keeping packets, from a callback:
//! //   Capture::start(&opts, Some(Box::new(move |p: &PacketRef<'_>| {
//! //       analyzer.push(p.ts_ns as i64, p.orig_len, p.linktype, p.data) })))
//! // and write a file at the same time with `output: Some(path)`.
//! ```
//!
//! The handle is opened on the capture thread after it entered `netns`, so it stays bound
//! to that namespace's interface. A large kernel buffer (16 MiB) in libpcap's block mode keeps
//! drops low (immediate mode is an option; see [`CaptureOptions::immediate`]); the loop is
//! non-blocking (poll on the capture fd and a stop pipe), so `stop` wakes it at once and
//! returns after draining (≤ ~70 ms of quiet in block mode, at most 500 ms under traffic).

use std::fs::File;
use std::io::BufWriter;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lagtrace_model::{Capability, Privilege};

/// A route as `ip route get` shows it (see [`route_get`]).
pub use lagtrace_model::diagnosis::evidence::Route;

use crate::{Error, Result};
use lagtrace_netns::NetNs;
use serde::Serialize;

use crate::annotate::PcapngWriter;

/// Default snapshot length, as tcpdump's.
pub const DEFAULT_SNAPLEN: u32 = 262_144;
/// Default kernel buffer: large enough for a burst of a few thousand full-size frames.
pub const DEFAULT_BUFFER_BYTES: u32 = 16 << 20;
/// How long the capture loop waits for packets before looking at its stop flag again.
const POLL_MS: i32 = 50;
/// libpcap read timeout: without immediate mode, the longest a captured packet waits in a
/// partly filled kernel block before it is handed over.
pub const BLOCK_TIMEOUT_MS: i32 = 50;

/// One captured packet, owned: what the analyzer consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedPacket {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// LINKTYPE_* of the capture (1 Ethernet, 113 Linux SLL, 276 SLL2, ...).
    pub linktype: u32,
    /// Length on the wire (may exceed `data.len()` when the snaplen cut it).
    pub orig_len: u32,
    /// The captured bytes, from the link-layer header on.
    pub data: Vec<u8>,
}

/// A captured packet borrowed from libpcap's buffer, as passed to a callback.
#[derive(Debug, Clone, Copy)]
pub struct PacketRef<'a> {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// LINKTYPE_* of the capture.
    pub linktype: u32,
    /// Length on the wire.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

impl PacketRef<'_> {
    /// Copies the packet out of libpcap's buffer.
    pub fn to_owned(&self) -> CapturedPacket {
        CapturedPacket {
            ts_ns: self.ts_ns,
            linktype: self.linktype,
            orig_len: self.orig_len,
            data: self.data.to_vec(),
        }
    }
}

/// Format of the file a capture writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum FileFormat {
    /// Classic pcap (nanosecond magic), written by libpcap's savefile.
    #[default]
    Pcap,
    /// pcapng (interface with `if_tsresol` = ns), written by [`PcapngWriter`].
    Pcapng,
}

/// What to capture and where to put it.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Interface name; "any" captures on all interfaces (Linux cooked link type).
    pub iface: String,
    /// Filter in tcpdump (pcap-filter) syntax.
    pub filter: Option<String>,
    /// Bytes kept of each packet.
    pub snaplen: u32,
    /// Namespace to capture in (the interface is looked up there).
    pub netns: NetNs,
    /// Kernel capture buffer size in bytes.
    pub buffer_bytes: u32,
    /// Stop after this many packets.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Write the packets to this file.
    pub output: Option<PathBuf>,
    /// Format of `output`.
    pub format: FileFormat,
    /// Put the interface into promiscuous mode (tcpdump's default; off here since lagtrace
    /// looks at this host's own traffic).
    pub promisc: bool,
    /// libpcap immediate mode: each packet is handed over at once. Off by default: on Linux
    /// it switches libpcap to one ring slot per packet sized for the largest (offloaded,
    /// 64 KiB) frame, so a 16 MiB buffer holds only ~256 packets and a flood drops
    /// (bench/capture_drops.sh). Without it packets come in blocks within [`BLOCK_TIMEOUT_MS`].
    pub immediate: bool,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            iface: "any".into(),
            filter: None,
            snaplen: DEFAULT_SNAPLEN,
            netns: NetNs::Current,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            count: None,
            duration: None,
            output: None,
            format: FileFormat::Pcap,
            promisc: false,
            immediate: false,
        }
    }
}

/// Why a capture ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// `stop()` was called (or Ctrl-C).
    Stopped,
    /// `count` packets were captured.
    Count,
    /// `duration` elapsed.
    Duration,
    /// Reading failed (e.g. the interface disappeared): see [`CaptureStats::error`]. What
    /// was captured before is in the counters and the file.
    Failed,
}

/// Counters at the end of a capture, as tcpdump prints them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaptureStats {
    /// Interface captured on.
    pub iface: String,
    /// LINKTYPE_* of the packets.
    pub linktype: u32,
    /// Packets handed to us (written / passed to the callback).
    pub captured: u64,
    /// Packets that passed the filter in the kernel (`ps_recv`).
    pub received_by_filter: u64,
    /// Packets the kernel dropped for lack of buffer space (`ps_drop`).
    pub dropped_by_kernel: u64,
    /// Packets dropped by the interface or driver (`ps_ifdrop`).
    pub dropped_by_interface: u64,
    /// Wall time from open to stop, µs.
    pub elapsed_us: u64,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// With [`StopReason::Failed`]: why reading stopped, one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Callback invoked on the capture thread for every packet.
pub type PacketCallback = Box<dyn FnMut(&PacketRef<'_>) + Send + 'static>;

/// The stop request: a flag, and a pipe whose read end is in the capture loop's poll set
/// so that a stop wakes it at once.
#[derive(Debug)]
struct StopSignal {
    flag: AtomicBool,
    wake_rd: OwnedFd,
    wake_wr: OwnedFd,
}

impl StopSignal {
    fn new() -> Result<StopSignal> {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills two fds on success; we take ownership of both.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if rc != 0 {
            return Err(Error::io(
                "creating the capture stop pipe",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: both fds were just created and are owned by nobody else.
        let (wake_rd, wake_wr) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(StopSignal {
            flag: AtomicBool::new(false),
            wake_rd,
            wake_wr,
        })
    }

    fn raise(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // A full pipe already wakes the loop; the result does not matter.
        // SAFETY: writing one byte from a valid buffer to a pipe fd we own.
        let _ = unsafe { libc::write(self.wake_wr.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }

    fn raised(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// Starts captures.
pub struct Capture;

impl Capture {
    /// Opens the capture (errors here: missing interface or privilege, bad filter, file not
    /// writable) and runs it on its own thread until `count`, `duration` or `stop()`.
    pub fn start(opts: &CaptureOptions, callback: Option<PacketCallback>) -> Result<CaptureHandle> {
        let stop = Arc::new(StopSignal::new()?);
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<u32>>(1);
        let opts2 = opts.clone();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lagtrace-capture".into())
            .spawn(move || run_capture(opts2, callback, stop2, ready_tx))
            .map_err(|e| Error::io("spawning the capture thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(linktype)) => Ok(CaptureHandle {
                stop,
                thread: Some(thread),
                iface: opts.iface.clone(),
                linktype,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(Error::Thread(
                    "capture thread ended before opening the capture",
                )),
            },
        }
    }

    /// Like [`Capture::start`], sending every packet (owned) to the returned channel.
    /// The channel is unbounded: a long capture should be consumed as it runs (or use a
    /// callback, or `output` and read the file afterwards).
    pub fn start_channel(
        opts: &CaptureOptions,
    ) -> Result<(CaptureHandle, mpsc::Receiver<CapturedPacket>)> {
        let (tx, rx) = mpsc::channel();
        let cb: PacketCallback = Box::new(move |p| {
            let _ = tx.send(p.to_owned());
        });
        Ok((Capture::start(opts, Some(cb))?, rx))
    }
}

/// A running capture. Dropping it stops the capture (and discards the stats).
pub struct CaptureHandle {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<Result<CaptureStats>>>,
    iface: String,
    linktype: u32,
}

/// Stops a capture from another thread (for example a Ctrl-C handler).
#[derive(Debug, Clone)]
pub struct Stopper(Arc<StopSignal>);

impl Stopper {
    /// Asks the capture to stop; it drains what the kernel holds and ends.
    pub fn stop(&self) {
        self.0.raise();
    }
}

impl CaptureHandle {
    /// The interface being captured.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// LINKTYPE_* of the capture.
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// A handle that can stop this capture from elsewhere.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// Whether the capture has ended by itself (count or duration).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops the capture, drains the packets already captured, and returns the stats.
    pub fn stop(self) -> Result<CaptureStats> {
        self.stop.raise();
        self.wait()
    }

    /// Waits until the capture ends by itself (count, duration, or a [`Stopper`]).
    pub fn wait(mut self) -> Result<CaptureStats> {
        let t = self.thread.take().expect("capture thread joined once");
        match t.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Drop for CaptureHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.raise();
            let _ = t.join();
        }
    }
}

enum Sink {
    None,
    Pcap(pcap::Savefile),
    Pcapng(PcapngWriter<BufWriter<File>>),
}

/// Turns libpcap's open errors into one line naming the cause.
/// libpcap reports a refused `socket(AF_PACKET)` only as text (`pcap::Error` has no errno):
/// reading that text happens here, once, and the caller gets a typed [`Error::Privilege`].
fn open_error(iface: &str, netns: &NetNs, e: pcap::Error) -> Error {
    let msg = e.to_string();
    let lower = msg.to_lowercase();
    if lower.contains("permission") || lower.contains("operation not permitted") {
        Error::Privilege(Privilege::new(
            Capability::NetRaw,
            format!("capturing on {iface}"),
            format!(
                " (run as root, or `setcap cap_net_raw+ep` on the binary); `lagtrace analyze` \
                 of a saved file works without it ({msg})"
            ),
        ))
    } else if lower.contains("no such device") {
        Error::NoInterface {
            iface: iface.to_string(),
            netns: netns.path(),
            msg,
        }
    } else {
        Error::capture(format!("opening capture on {iface}"), msg)
    }
}

/// Where each captured packet goes: the file sink, the caller's callback, the count.
struct Delivery {
    sink: Sink,
    /// The first error writing the pcapng file (reported at the end; capture goes on).
    write_err: Option<std::io::Error>,
    callback: Option<PacketCallback>,
    linktype: u32,
    captured: u64,
}

impl Delivery {
    fn packet(&mut self, p: pcap::Packet<'_>) {
        let ts_ns = (p.header.ts.tv_sec as u64) * 1_000_000_000 + p.header.ts.tv_usec as u64;
        match &mut self.sink {
            Sink::None => {}
            Sink::Pcap(s) => s.write(&p),
            Sink::Pcapng(w) => {
                if self.write_err.is_none()
                    && let Err(e) = w.write_packet(0, ts_ns, p.header.len, p.data, None)
                {
                    self.write_err = Some(e);
                }
            }
        }
        if let Some(cb) = self.callback.as_mut() {
            cb(&PacketRef {
                ts_ns,
                linktype: self.linktype,
                orig_len: p.header.len,
                data: p.data,
            });
        }
        self.captured += 1;
    }

    /// Flushes the capture file, reporting the first write error.
    fn finish(self) -> Result<()> {
        match self.sink {
            Sink::None => Ok(()),
            Sink::Pcap(mut s) => s
                .flush()
                .map_err(|e| Error::capture("writing capture file", e)),
            Sink::Pcapng(w) => {
                if let Some(e) = self.write_err {
                    return Err(Error::capture("writing capture file", e));
                }
                w.finish()
                    .map_err(|e| Error::io("writing capture file", e))
                    .map(drop)
            }
        }
    }
}

/// An open capture and where its packets go.
struct Session {
    cap: pcap::Capture<pcap::Active>,
    out: Delivery,
    count: Option<u64>,
}

impl Session {
    /// Whether `count` packets have been captured.
    fn count_reached(&self) -> bool {
        self.count.is_some_and(|c| self.out.captured >= c)
    }

    /// Hands over what libpcap has buffered (never past `count`); the number of packets.
    fn dispatch(&mut self) -> std::result::Result<usize, pcap::Error> {
        let left = match self.count {
            Some(c) => c.saturating_sub(self.out.captured).min(100_000) as usize,
            None => 100_000,
        };
        let out = &mut self.out;
        self.cap.dispatch(Some(left), |p| out.packet(p))
    }

    /// Captures until count, duration, a stop, or a read error (the interface went away: what
    /// was captured so far is still flushed and counted, the error is returned as text).
    fn capture(
        &mut self,
        opts: &CaptureOptions,
        stop: &StopSignal,
        deadline: Option<Instant>,
    ) -> (StopReason, Option<String>) {
        loop {
            if self.count_reached() {
                return (StopReason::Count, None);
            }
            if stop.raised() {
                return (StopReason::Stopped, None);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return (StopReason::Duration, None);
            }
            match self.dispatch() {
                Ok(0) => {
                    let mut wait = POLL_MS;
                    if let Some(d) = deadline {
                        let left = d.saturating_duration_since(now).as_millis() as i32 + 1;
                        wait = wait.min(left);
                    }
                    poll_in(&[self.cap.as_raw_fd(), stop.wake_rd.as_raw_fd()], wait);
                }
                Ok(_) => {}
                Err(e) => {
                    let msg = format!("reading packets on {}: {e}", opts.iface);
                    return (StopReason::Failed, Some(msg));
                }
            }
        }
    }

    /// Drains what the kernel already captured before the stop (not past `count`). Without
    /// immediate mode the last packets sit in a block the kernel hands over only when its
    /// timeout expires, so this waits until the interface has been quiet for longer than that.
    fn drain(&mut self, opts: &CaptureOptions) -> Result<()> {
        let quiet_for = Duration::from_millis(if opts.immediate {
            10
        } else {
            BLOCK_TIMEOUT_MS as u64 + 20
        });
        let hard_end = Instant::now() + Duration::from_millis(500);
        let mut last_data = Instant::now();
        while Instant::now() < hard_end && !self.count_reached() {
            let n = self
                .dispatch()
                .map_err(|e| Error::capture(format!("reading packets on {}", opts.iface), e))?;
            if n > 0 {
                last_data = Instant::now();
            } else if last_data.elapsed() >= quiet_for {
                break;
            } else {
                poll_in(&[self.cap.as_raw_fd()], 10);
            }
        }
        Ok(())
    }

    /// The kernel's counters; after a read error they are gone with the interface, so what
    /// was counted here stands in.
    fn stats(&mut self, failed: bool) -> Result<pcap::Stat> {
        match self.cap.stats() {
            Ok(st) => Ok(st),
            Err(_) if failed => Ok(pcap::Stat {
                received: self.out.captured.min(u64::from(u32::MAX)) as u32,
                dropped: 0,
                if_dropped: 0,
            }),
            Err(e) => Err(Error::capture("reading capture statistics", e)),
        }
    }
}

/// Waits up to `ms` for any of `fds` to become readable.
fn poll_in(fds: &[std::os::fd::RawFd], ms: i32) {
    let mut pfd: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfd` holds `pfd.len()` valid pollfds for the duration of the call.
    unsafe { libc::poll(pfd.as_mut_ptr(), pfd.len() as libc::nfds_t, ms) };
}

fn run_capture(
    opts: CaptureOptions,
    callback: Option<PacketCallback>,
    stop: Arc<StopSignal>,
    ready: mpsc::SyncSender<Result<u32>>,
) -> Result<CaptureStats> {
    let (cap, sink, linktype) = match open(&opts) {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Err(Error::Thread("capture not opened"));
        }
    };
    let _ = ready.send(Ok(linktype));
    let started = Instant::now();
    let mut session = Session {
        cap,
        out: Delivery {
            sink,
            write_err: None,
            callback,
            linktype,
            captured: 0,
        },
        count: opts.count,
    };
    let deadline = opts.duration.map(|d| started + d);
    let (reason, failure) = session.capture(&opts, &stop, deadline);
    if reason != StopReason::Count && reason != StopReason::Failed {
        session.drain(&opts)?;
    }
    let elapsed = started.elapsed();
    let st = session.stats(failure.is_some())?;
    let captured = session.out.captured;
    session.out.finish()?;
    Ok(CaptureStats {
        iface: opts.iface.clone(),
        linktype,
        captured,
        received_by_filter: st.received as u64,
        dropped_by_kernel: st.dropped as u64,
        dropped_by_interface: st.if_dropped as u64,
        elapsed_us: elapsed.as_micros() as u64,
        stop_reason: reason,
        error: failure,
    })
}

fn open(opts: &CaptureOptions) -> Result<(pcap::Capture<pcap::Active>, Sink, u32)> {
    if let Some(p) = opts.netns.path() {
        if !p.exists() {
            return Err(Error::NoNamespace(p.to_path_buf()));
        }
        opts.netns.enter_current_thread().map_err(|e| match e {
            lagtrace_netns::Error::Privilege(mut p) => {
                p.hint
                    .push_str("; capturing in the current namespace works without it");
                Error::Privilege(p)
            }
            e => Error::Netns(e),
        })?;
    }
    if opts.snaplen == 0 {
        return Err(Error::Usage("snaplen must be at least 1 byte".into()));
    }
    let inactive = pcap::Capture::from_device(opts.iface.as_str())
        .map_err(|e| open_error(&opts.iface, &opts.netns, e))?;
    let cap = inactive
        .snaplen(opts.snaplen.min(i32::MAX as u32) as i32)
        .buffer_size(opts.buffer_bytes.min(i32::MAX as u32) as i32)
        .immediate_mode(opts.immediate)
        .promisc(opts.promisc)
        .precision(pcap::Precision::Nano)
        .timeout(BLOCK_TIMEOUT_MS)
        .open()
        .map_err(|e| open_error(&opts.iface, &opts.netns, e))?;
    let mut cap = cap.setnonblock().map_err(|e| {
        Error::capture(
            format!("capture on {}: setting non-blocking mode", opts.iface),
            e,
        )
    })?;
    if let Some(f) = opts.filter.as_deref().filter(|f| !f.trim().is_empty()) {
        cap.filter(f, true)
            .map_err(|e| Error::capture(format!("bad filter {f:?}"), e))?;
    }
    let linktype = cap.get_datalink().0 as u32;
    let sink = match &opts.output {
        None => Sink::None,
        Some(path) => match opts.format {
            FileFormat::Pcap => Sink::Pcap(
                cap.savefile(path)
                    .map_err(|e| Error::capture(format!("creating {}", path.display()), e))?,
            ),
            FileFormat::Pcapng => {
                let f = File::create(path)
                    .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
                let mut w = PcapngWriter::new(BufWriter::with_capacity(1 << 20, f))
                    .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                w.add_interface(linktype as u16, opts.snaplen, 9, Some(&opts.iface))
                    .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                Sink::Pcapng(w)
            }
        },
    };
    Ok((cap, sink, linktype))
}

/// The interface the route to `host` leaves by, in `netns` (via `ip route get`).
/// `None` when there is no route or `ip` fails (callers then use "any").
pub fn route_iface(host: std::net::IpAddr, netns: &NetNs) -> Option<String> {
    route_get(host, netns).map(|r| r.dev)
}

/// The route to `host` in `netns` as `ip route get HOST` shows it. `None` when there is no
/// route, `ip` fails, or it names no device.
pub fn route_get(host: std::net::IpAddr, netns: &NetNs) -> Option<Route> {
    let mut cmd = std::process::Command::new("ip");
    if let NetNs::Named(n) = netns {
        cmd.args(["-n", n]);
    }
    let out = cmd
        .args(["route", "get", &host.to_string()])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_route_get(&String::from_utf8_lossy(&out.stdout))
}

/// The route in `ip route get`'s output: its first line, `[TYPE] DST [from ..] [via [FAMILY]
/// GW] dev DEV [table T] [src SRC] ...` (no type word: unicast). `None` without a device.
pub fn parse_route_get(text: &str) -> Option<Route> {
    let words: Vec<&str> = text.lines().next()?.split_whitespace().collect();
    let first = *words.first()?;
    let kind = if first.parse::<std::net::IpAddr>().is_ok() {
        "unicast"
    } else {
        first
    };
    let after = |key: &str| {
        let i = words.iter().position(|w| *w == key)?;
        words.get(i + 1).map(|w| (i + 1, w.to_string()))
    };
    let via = after("via").map(|(i, v)| match (v.as_str(), words.get(i + 1)) {
        ("inet" | "inet6", Some(gw)) => format!("{v} {gw}"),
        _ => v,
    });
    Some(Route {
        kind: kind.to_string(),
        dev: after("dev")?.1,
        via,
        src: after("src").map(|(_, v)| v),
        table: after("table").map(|(_, v)| v).filter(|t| t != "main"),
    })
}

/// One line per packet like `tcpdump -nn -S` without TCP options: time of day (UTC),
/// addresses and ports, TCP flags, absolute seq (range when carrying data)/ack, window and
/// payload length.
pub fn summary_line(p: &PacketRef<'_>) -> String {
    use etherparse::{EtherType, LaxNetSlice, LaxSlicedPacket, TransportSlice};
    let secs = p.ts_ns / 1_000_000_000;
    let us = (p.ts_ns % 1_000_000_000) / 1000;
    let tod = secs % 86_400;
    let time = format!(
        "{:02}:{:02}:{:02}.{:06}",
        tod / 3600,
        tod / 60 % 60,
        tod % 60,
        us
    );
    let d = p.data;
    let sliced = match p.linktype {
        1 => LaxSlicedPacket::from_ethernet(d).ok(),
        113 if d.len() >= 16 => Some(LaxSlicedPacket::from_ether_type(
            EtherType(u16::from_be_bytes([d[14], d[15]])),
            &d[16..],
        )),
        276 if d.len() >= 20 => Some(LaxSlicedPacket::from_ether_type(
            EtherType(u16::from_be_bytes([d[0], d[1]])),
            &d[20..],
        )),
        0 | 108 if d.len() >= 4 => LaxSlicedPacket::from_ip(&d[4..]).ok(),
        12 | 14 | 101 | 228 | 229 => LaxSlicedPacket::from_ip(d).ok(),
        _ => None,
    };
    let Some(s) = sliced else {
        return format!("{time} linktype {} length {}", p.linktype, p.orig_len);
    };
    let (src, dst, fam, ip_payload_len) = match &s.net {
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            let len = (h.total_len() as usize).saturating_sub(h.slice().len());
            (
                h.source_addr().to_string(),
                h.destination_addr().to_string(),
                "IP",
                len,
            )
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            let ext = v6.extensions().slice().len();
            (
                h.source_addr().to_string(),
                h.destination_addr().to_string(),
                "IP6",
                (h.payload_length() as usize).saturating_sub(ext),
            )
        }
        Some(LaxNetSlice::Arp(_)) => return format!("{time} ARP, length {}", p.orig_len),
        None => return format!("{time} non-IP, length {}", p.orig_len),
    };
    match &s.transport {
        Some(TransportSlice::Tcp(t)) => {
            let mut flags = String::new();
            for (on, c) in [
                (t.syn(), 'S'),
                (t.fin(), 'F'),
                (t.psh(), 'P'),
                (t.rst(), 'R'),
                (t.urg(), 'U'),
                (t.ece(), 'E'),
                (t.cwr(), 'W'),
            ] {
                if on {
                    flags.push(c);
                }
            }
            if t.ack() {
                flags.push('.');
            }
            let hl = t.data_offset() as usize * 4;
            let len = ip_payload_len.saturating_sub(hl);
            let seq = t.sequence_number();
            // As tcpdump -S: a segment with data shows its sequence range, a pure ACK none.
            let seq = if len > 0 {
                format!(", seq {seq}:{}", seq.wrapping_add(len as u32))
            } else if t.syn() || t.fin() || t.rst() {
                format!(", seq {seq}")
            } else {
                String::new()
            };
            let mut line = format!(
                "{time} {fam} {src}.{} > {dst}.{}: Flags [{flags}]{seq}",
                t.source_port(),
                t.destination_port(),
            );
            if t.ack() {
                line.push_str(&format!(", ack {}", t.acknowledgment_number()));
            }
            line.push_str(&format!(", win {}, length {len}", t.window_size()));
            line
        }
        Some(TransportSlice::Udp(u)) => format!(
            "{time} {fam} {src}.{} > {dst}.{}: UDP, length {}",
            u.source_port(),
            u.destination_port(),
            ip_payload_len.saturating_sub(8)
        ),
        _ => format!("{time} {fam} {src} > {dst}: length {}", p.orig_len),
    }
}

/// libpcap's name and description of a link type, e.g. ("EN10MB", "Ethernet").
pub fn linktype_name(linktype: u32) -> (String, String) {
    let lt = pcap::Linktype(linktype as i32);
    (
        lt.get_name().unwrap_or_else(|_| linktype.to_string()),
        lt.get_description().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn line(linktype: u32, data: &[u8]) -> String {
        let p = PacketRef {
            ts_ns: 3_723_000_123_456, // 01:02:03.000123456 UTC
            linktype,
            orig_len: data.len() as u32,
            data,
        };
        summary_line(&p)
    }

    fn v6_psh_ack() -> Vec<u8> {
        let mut src = [0u8; 16];
        src[15] = 1;
        let mut dst = [0u8; 16];
        dst[0] = 0xfd;
        dst[15] = 2;
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6(src, dst, 64)
            .tcp(40000, 8080, 1000, 512)
            .psh()
            .ack(77);
        let mut v = Vec::new();
        b.write(&mut v, b"hello").unwrap();
        v
    }

    #[test]
    fn ipv6_tcp_over_ethernet_reads_like_tcpdump() {
        assert_eq!(
            line(1, &v6_psh_ack()),
            "01:02:03.000123 IP6 ::1.40000 > fd00::2.8080: Flags [P.], seq 1000:1005, \
             ack 77, win 512, length 5"
        );
    }

    #[test]
    fn cooked_sll2_and_raw_ip_give_the_same_line() {
        let eth = v6_psh_ack();
        let ip = &eth[14..];
        let mut sll2 = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6];
        sll2.extend_from_slice(&[1; 8]);
        sll2.extend_from_slice(ip);
        let want = line(1, &eth);
        assert_eq!(line(276, &sll2), want);
        assert_eq!(line(101, ip), want);
        // A cut packet still names its link type instead of panicking.
        assert_eq!(
            line(276, &sll2[..10]),
            "01:02:03.000123 linktype 276 length 10"
        );
    }

    #[test]
    fn syn_shows_seq_and_a_pure_ack_does_not() {
        let syn = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .tcp(1234, 80, 4_294_967_295, 64240)
            .syn();
        let mut v = Vec::new();
        syn.write(&mut v, &[]).unwrap();
        assert!(
            line(1, &v).ends_with(
                "10.0.0.1.1234 > 10.0.0.2.80: Flags [S], seq 4294967295, win 64240, length 0"
            ),
            "{}",
            line(1, &v)
        );
        let ack = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 2], [10, 0, 0, 1], 64)
            .tcp(80, 1234, 5, 100)
            .ack(9);
        let mut v = Vec::new();
        ack.write(&mut v, &[]).unwrap();
        assert!(
            line(1, &v).ends_with("Flags [.], ack 9, win 100, length 0"),
            "{}",
            line(1, &v)
        );
    }

    #[test]
    fn ip_route_get_output_gives_the_route_to_repeat() {
        let r = parse_route_get("10.0.2.2 via 10.0.0.2 dev v0l src 10.0.0.1 uid 0 \n    cache \n")
            .unwrap();
        assert_eq!(
            (
                r.kind.as_str(),
                r.dev.as_str(),
                r.via.as_deref(),
                r.src.as_deref()
            ),
            ("unicast", "v0l", Some("10.0.0.2"), Some("10.0.0.1"))
        );
        assert_eq!(r.table, None);
        let r = parse_route_get("10.9.0.2 dev veth-a src 10.9.0.1 uid 0 \n    cache \n").unwrap();
        assert_eq!((r.via, r.dev.as_str()), (None, "veth-a"));
        let r = parse_route_get(
            "fd00:1:2::2 from :: via fd00:1:1::2 dev v0l proto static src fd00:1:1::1 \
             metric 1024 pref medium\n",
        )
        .unwrap();
        assert_eq!(r.via.as_deref(), Some("fd00:1:1::2"));
        assert_eq!(r.src.as_deref(), Some("fd00:1:1::1"));
        let r =
            parse_route_get("10.1.0.9 via inet6 fe80::1 dev eth0 table 100 src 10.1.0.1 uid 0\n")
                .unwrap();
        assert_eq!(r.via.as_deref(), Some("inet6 fe80::1"));
        assert_eq!(r.table.as_deref(), Some("100"));
        let r =
            parse_route_get("local 127.0.0.1 dev lo table local src 127.0.0.1 uid 0\n").unwrap();
        assert_eq!(
            (r.kind.as_str(), r.table.as_deref()),
            ("local", Some("local"))
        );
        assert_eq!(parse_route_get(""), None);
        assert_eq!(parse_route_get("10.0.0.1 via 10.0.0.2\n"), None);
    }
}
