//! The event loop: one thread per share of the connections, each with its own epoll (mio),
//! non-blocking sockets, one request in flight per connection, and its own histograms.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use lagtrace_model::{RequestError, RequestRecord};

use crate::http::ResponseParser;
use crate::records::{RecordOptions, Recorder, syn_retransmits};

/// Highest latency a histogram holds (1 hour, in µs); larger values are clamped.
pub(crate) const HIST_HIGH_US: u64 = 3_600_000_000;
const READ_BUF: usize = 64 * 1024;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const SCAN_EVERY: Duration = Duration::from_millis(5);
const GEN_SHIFT: u32 = 24;

pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_HIGH_US, 3).expect("static histogram bounds are valid")
}

/// What all worker threads share (read-only, plus counters).
pub(crate) struct Shared<'a> {
    pub addr: SocketAddr,
    pub request: &'a [u8],
    pub method: &'a str,
    pub tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub quickack: bool,
    pub start: Instant,
    pub end: Instant,
    pub stop: &'a AtomicBool,
    /// With `-n`: the request budget and how many were claimed.
    pub budget: Option<(u64, AtomicU64)>,
    /// With `--rate`: the interval between two requests of one connection, and the spacing
    /// between the first requests of consecutive connections.
    pub pacing: Option<(Duration, Duration)>,
    pub progress: Vec<ThreadCounters>,
    /// With `--hdr-log`: the interval length, a whole number of milliseconds. Intervals are
    /// aligned to the wall clock (interval `k` holds the responses completed in
    /// `[k·len, (k+1)·len)` µs since the Unix epoch), so logs of workers started at
    /// different moments share their interval boundaries.
    pub interval: Option<Duration>,
    /// `start` on `CLOCK_REALTIME`, µs since the Unix epoch (the records' `start_unix_us`).
    pub start_unix_us: u64,
    /// Per-request records, when asked for.
    pub records: Option<RecordOptions>,
}

/// Live counters of one thread, read by the progress loop.
#[derive(Default)]
pub(crate) struct ThreadCounters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
}

/// Error counts by kind.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Errs {
    pub connect: u64,
    pub read: u64,
    pub write: u64,
    pub timeout: u64,
    pub status: u64,
}

/// One thread's histograms of one wall-clock interval of the run (for `--hdr-log`).
pub(crate) struct Interval {
    /// The sending thread.
    pub thread: usize,
    /// Interval index: µs since the Unix epoch / interval length.
    pub slot: u64,
    /// `false`: the thread has moved past this interval; `true`: its last one (the run ended).
    pub last: bool,
    /// Latency (as the report's: corrected with `--rate`).
    pub latency: Histogram<u64>,
    /// With `--rate`: from the actual send times.
    pub uncorrected: Histogram<u64>,
    /// First requests of connections.
    pub first: Histogram<u64>,
}

/// The histograms of the interval a thread is filling.
struct IntervalHists {
    slot: u64,
    /// When the next interval begins.
    next: Instant,
    latency: Histogram<u64>,
    uncorrected: Histogram<u64>,
    first: Histogram<u64>,
}

/// What one thread measured.
pub(crate) struct ThreadResult {
    pub hist: Histogram<u64>,
    pub uncorrected: Histogram<u64>,
    pub first: Histogram<u64>,
    pub requests: u64,
    pub bytes: u64,
    pub errors: Errs,
    pub status: Vec<u64>,
    pub rate_samples: Vec<f64>,
    pub connects: u64,
    pub ended: Instant,
    /// Kept per-request records, how many were made, how many of them pending (with
    /// `Shared::records`).
    pub records: Option<(Vec<RequestRecord>, u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// No socket; connect when a request is due.
    Closed,
    Connecting,
    /// Connected, no request in flight (waiting for its send time, or the budget is spent).
    Idle,
    Sending,
    Receiving,
}

struct Io {
    sock: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
}

impl Io {
    fn write_req(&mut self, req: &[u8], written: &mut usize) -> io::Result<bool> {
        if let Some(tls) = &mut self.tls {
            if *written == 0 {
                tls.writer().write_all(req)?;
                *written = req.len();
            }
            return self.flush_tls();
        }
        while *written < req.len() {
            match self.sock.write(&req[*written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => *written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Sends what TLS has queued; `Ok(false)` when the socket is full.
    fn flush_tls(&mut self) -> io::Result<bool> {
        if let Some(tls) = &mut self.tls {
            while tls.wants_write() {
                match tls.write_tls(&mut self.sock) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(true)
    }

    /// Like a socket read: `Ok(0)` at end of stream, `WouldBlock` when nothing is there.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return self.sock.read(buf);
        };
        loop {
            match tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            match tls.read_tls(&mut self.sock) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Err(e) = tls.process_new_packets() {
                // Send the alert, then report the failure.
                let _ = tls.write_tls(&mut self.sock);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            while tls.wants_write() {
                match tls.write_tls(&mut self.sock) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// A timerfd (CLOCK_MONOTONIC, ns resolution) so `--rate` sends on time: epoll's own timeout
/// has 1 ms granularity, which would make every paced request up to 1 ms late.
struct TimerFd(std::os::fd::OwnedFd);

impl TimerFd {
    fn new() -> io::Result<Self> {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        Ok(TimerFd(timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?))
    }

    /// Fires once after `d` (relative), replacing any earlier setting.
    fn arm(&self, d: Duration) -> io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let d = d.max(Duration::from_nanos(1));
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: d.as_secs() as _,
                tv_nsec: d.subsec_nanos() as _,
            },
        };
        timerfd_settime(&self.0, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut b);
    }
}

const TIMER_TOKEN: Token = Token(usize::MAX - 1);

struct Conn {
    io: Option<Io>,
    st: St,
    generation: u32,
    parser: ResponseParser,
    written: usize,
    sent: Instant,
    intended: Instant,
    deadline: Instant,
    next: Instant,
    on_conn: u64,
    /// Timestamps for the per-request record; written only when records are on.
    track: Track,
}

/// What a per-request record needs beyond the engine's own state: plain values, no
/// allocation. Times are `None` until they happen.
struct Track {
    conn: u64,
    local: Option<SocketAddr>,
    connect_start: Instant,
    connect_end: Option<Instant>,
    syn_retransmits: Option<u32>,
    sent_first: Option<Instant>,
    sent_last: Option<Instant>,
    first_byte: Option<Instant>,
    bytes: u64,
}

enum Kind {
    Read,
    Write,
    Timeout,
}

struct Worker<'s, 'a> {
    sh: &'s Shared<'a>,
    id: usize,
    poll: Poll,
    conns: Vec<Conn>,
    timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    timerfd: Option<(TimerFd, Option<Instant>)>,
    retry: Vec<usize>,
    buf: Vec<u8>,
    interval_tx: Option<Sender<Interval>>,
    interval: Option<IntervalHists>,
    r: ThreadResult,
    rec: Option<Recorder>,
    /// Id of the next connect attempt of this thread (ids step by the thread count).
    next_conn: u64,
}

/// Runs one worker thread over `count` connections whose global indices start at `first`.
pub(crate) fn run_thread(
    sh: &Shared<'_>,
    id: usize,
    first: usize,
    count: usize,
    interval_tx: Option<Sender<Interval>>,
) -> io::Result<ThreadResult> {
    let now = Instant::now();
    let mut w = Worker {
        sh,
        id,
        poll: Poll::new()?,
        conns: Vec::with_capacity(count),
        timers: BinaryHeap::new(),
        timerfd: None,
        retry: Vec::new(),
        buf: vec![0; READ_BUF],
        interval: interval_tx.as_ref().and(sh.interval).map(|every| {
            let (slot, next) = slot_at(sh, every, now);
            IntervalHists {
                slot,
                next,
                latency: new_hist(),
                uncorrected: new_hist(),
                first: new_hist(),
            }
        }),
        interval_tx,
        r: ThreadResult {
            hist: new_hist(),
            uncorrected: new_hist(),
            first: new_hist(),
            requests: 0,
            bytes: 0,
            errors: Errs::default(),
            status: vec![0; 1000],
            rate_samples: Vec::new(),
            connects: 0,
            ended: now,
            records: None,
        },
        rec: sh.records.map(|o| Recorder::new(o, id as u64 + 1)),
        next_conn: id as u64,
    };
    for k in 0..count {
        let next = match sh.pacing {
            Some((_, spacing)) => sh.start + spacing * (first + k) as u32,
            None => sh.start,
        };
        w.conns.push(Conn {
            io: None,
            st: St::Closed,
            generation: 0,
            parser: ResponseParser::new(sh.method),
            written: 0,
            sent: now,
            intended: now,
            deadline: now,
            next,
            on_conn: 0,
            track: Track {
                conn: 0,
                local: None,
                connect_start: now,
                connect_end: None,
                syn_retransmits: None,
                sent_first: None,
                sent_last: None,
                first_byte: None,
                bytes: 0,
            },
        });
    }
    if sh.pacing.is_some() {
        let t = TimerFd::new()?;
        use std::os::fd::AsRawFd;
        w.poll.registry().register(
            &mut mio::unix::SourceFd(&t.0.as_raw_fd()),
            TIMER_TOKEN,
            Interest::READABLE,
        )?;
        w.timerfd = Some((t, None));
    }
    for i in 0..count {
        w.connect(i, now);
    }
    w.run()?;
    w.r.ended = Instant::now();
    w.count_established();
    w.record_pending(w.r.ended);
    if let Some(rec) = w.rec.take() {
        let (seen, pending) = (rec.seen, rec.pending);
        w.r.records = Some((rec.finish(), seen, pending));
    }
    w.send_interval(true);
    Ok(w.r)
}

/// The wall-clock interval `now` falls in, and the instant the next one begins.
fn slot_at(sh: &Shared<'_>, every: Duration, now: Instant) -> (u64, Instant) {
    let every_us = (every.as_micros() as u64).max(1);
    let wall = sh.start_unix_us + us_since(sh.start, now);
    let slot = wall / every_us;
    let next_us = (slot + 1) * every_us - sh.start_unix_us;
    (slot, sh.start + Duration::from_micros(next_us))
}

/// Whole µs from `start` to `x` (the unit of the records and of the histograms): a latency
/// is the difference of two such times, so a record's `wait_us` and the histogram agree.
fn us_since(start: Instant, x: Instant) -> u64 {
    x.saturating_duration_since(start).as_micros() as u64
}

impl Worker<'_, '_> {
    /// Sends the interval being filled (when logging): at a rollover, or the last one.
    fn send_interval(&mut self, last: bool) {
        let (Some(iv), Some(tx)) = (&mut self.interval, &self.interval_tx) else {
            return;
        };
        let _ = tx.send(Interval {
            thread: self.id,
            slot: iv.slot,
            last,
            latency: iv.latency.clone(),
            uncorrected: iv.uncorrected.clone(),
            first: iv.first.clone(),
        });
        iv.latency.reset();
        iv.uncorrected.reset();
        iv.first.reset();
    }

    /// At or after an interval boundary: sends the finished interval, starts the next.
    fn roll_interval(&mut self, now: Instant) {
        let (Some(iv), Some(every)) = (&self.interval, self.sh.interval) else {
            return;
        };
        if now < iv.next {
            return;
        }
        self.send_interval(false);
        let (slot, next) = slot_at(self.sh, every, now);
        if let Some(iv) = &mut self.interval {
            iv.slot = slot;
            iv.next = next;
        }
    }

    /// Runs until the end, a stop, or the budget is spent.
    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut last_scan = Instant::now();
        let mut last_sample = last_scan;
        let mut sample_reqs = 0u64;
        loop {
            let now = Instant::now();
            if self.sh.stop.load(Ordering::Relaxed) || now >= self.sh.end || self.budget_done() {
                return Ok(());
            }
            let mut wait = SCAN_EVERY.min(self.sh.end - now);
            if let Some(&Reverse((t, _, _))) = self.timers.peek() {
                let d = t.saturating_duration_since(now);
                match &mut self.timerfd {
                    Some((fd, armed)) if d < wait && !d.is_zero() => {
                        // Wake at t exactly; re-arm only when the earliest send moved earlier.
                        if armed.is_none_or(|a| a > t || a <= now) {
                            fd.arm(d)?;
                            *armed = Some(t);
                        }
                    }
                    _ => wait = wait.min(d),
                }
            }
            if !self.retry.is_empty() {
                wait = Duration::ZERO;
            }
            if let Err(e) = self.poll.poll(&mut events, Some(wait))
                && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(e);
            }
            for ev in events.iter() {
                if ev.token() == TIMER_TOKEN {
                    if let Some((fd, armed)) = &mut self.timerfd {
                        fd.drain();
                        *armed = None;
                    }
                    continue;
                }
                let t = ev.token().0;
                let i = t & ((1 << GEN_SHIFT) - 1);
                let g = (t >> GEN_SHIFT) as u32;
                if i >= self.conns.len() || self.conns[i].generation & 0xff != g {
                    continue;
                }
                self.on_event(
                    i,
                    ev.is_readable() || ev.is_read_closed(),
                    ev.is_read_closed() || ev.is_error(),
                    ev.is_writable() || ev.is_error(),
                );
            }
            let now = Instant::now();
            while let Some(&Reverse((t, i, g))) = self.timers.peek() {
                if t > now {
                    break;
                }
                self.timers.pop();
                if self.conns[i].generation == g && self.conns[i].st == St::Idle {
                    self.start_request(i, now);
                }
            }
            for i in std::mem::take(&mut self.retry) {
                if self.conns[i].st == St::Closed {
                    self.connect(i, now);
                }
            }
            if now - last_scan >= SCAN_EVERY {
                last_scan = now;
                self.scan_deadlines(now);
            }
            if now - last_sample >= SAMPLE_EVERY {
                let done = self.r.requests - sample_reqs;
                self.r
                    .rate_samples
                    .push(done as f64 / (now - last_sample).as_secs_f64());
                sample_reqs = self.r.requests;
                last_sample = now;
                let c = &self.sh.progress[self.id];
                c.requests.store(self.r.requests, Ordering::Relaxed);
                let e = self.r.errors;
                c.errors
                    .store(e.connect + e.read + e.write + e.timeout, Ordering::Relaxed);
            }
            self.roll_interval(now);
        }
    }

    fn budget_done(&self) -> bool {
        match &self.sh.budget {
            Some((n, claimed)) => {
                claimed.load(Ordering::Relaxed) >= *n
                    && !self
                        .conns
                        .iter()
                        .any(|c| matches!(c.st, St::Sending | St::Receiving))
            }
            None => false,
        }
    }

    fn budget_spent(&self) -> bool {
        self.sh
            .budget
            .as_ref()
            .is_some_and(|(n, claimed)| claimed.load(Ordering::Relaxed) >= *n)
    }

    fn claim(&self) -> bool {
        match &self.sh.budget {
            Some((n, claimed)) => claimed.fetch_add(1, Ordering::Relaxed) < *n,
            None => true,
        }
    }

    fn connect(&mut self, i: usize, now: Instant) {
        let c = &mut self.conns[i];
        if let Some(mut io) = c.io.take() {
            let _ = self.poll.registry().deregister(&mut io.sock);
        }
        c.generation = c.generation.wrapping_add(1);
        c.on_conn = 0;
        c.parser.reset();
        if self.rec.is_some() {
            c.track.conn = self.next_conn;
            self.next_conn += self.sh.progress.len() as u64;
            c.track.local = None;
            c.track.connect_start = now;
            c.track.connect_end = None;
            c.track.syn_retransmits = None;
        }
        let Ok(sock) = open_socket(self.sh.addr) else {
            return self.connect_failed(i, now, RequestError::Connect);
        };
        if self.rec.is_some() {
            c.track.local = sock.local_addr().ok().and_then(|a| a.as_socket());
        }
        let mut sock = TcpStream::from_std(std::net::TcpStream::from(sock));
        let token = Token(i | (((c.generation & 0xff) as usize) << GEN_SHIFT));
        if self
            .poll
            .registry()
            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
            .is_err()
        {
            return self.connect_failed(i, now, RequestError::Connect);
        }
        let tls = match &self.sh.tls {
            Some((cfg, name)) => match rustls::ClientConnection::new(cfg.clone(), name.clone()) {
                Ok(t) => Some(Box::new(t)),
                Err(_) => return self.connect_failed(i, now, RequestError::Connect),
            },
            None => None,
        };
        c.io = Some(Io { sock, tls });
        c.st = St::Connecting;
        c.deadline = now + self.sh.connect_timeout;
    }

    /// A connect failed (or timed out): count it, record it, and connect again.
    fn connect_failed(&mut self, i: usize, now: Instant, kind: RequestError) {
        self.r.errors.connect += 1;
        if self.rec.is_some() {
            let c = &mut self.conns[i];
            c.track.connect_end = Some(now);
            if let Some(io) = &c.io {
                c.track.syn_retransmits = syn_retransmits(&io.sock);
            }
            self.record(i, now, None, Some(kind), false, false);
        }
        self.drop_conn(i);
        self.retry.push(i);
    }

    fn on_event(&mut self, i: usize, readable: bool, closed: bool, writable: bool) {
        if self.conns[i].st == St::Connecting {
            let io = self.conns[i].io.as_ref().expect("connecting has a socket");
            let res = match io.sock.take_error() {
                Ok(Some(e)) | Err(e) => Err(e),
                Ok(None) => io.sock.peer_addr().map(|_| ()),
            };
            match res {
                Ok(()) => {
                    self.r.connects += 1;
                    self.conns[i].st = St::Idle;
                    let now = Instant::now();
                    if self.rec.is_some() {
                        let c = &mut self.conns[i];
                        c.track.connect_end = Some(now);
                        c.track.syn_retransmits =
                            c.io.as_ref().and_then(|io| syn_retransmits(&io.sock));
                    }
                    self.start_request(i, now);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    let kind = if e.kind() == io::ErrorKind::ConnectionRefused {
                        RequestError::ConnectRefused
                    } else {
                        RequestError::Connect
                    };
                    self.connect_failed(i, Instant::now(), kind);
                    return;
                }
            }
        }
        if writable {
            self.on_writable(i);
        }
        if readable && self.conns[i].io.is_some() {
            self.on_readable(i, closed);
        }
    }

    fn on_writable(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let Some(io) = c.io.as_mut() else { return };
        let res = if c.st == St::Sending {
            io.write_req(self.sh.request, &mut c.written)
        } else {
            io.flush_tls()
        };
        match res {
            Ok(true) if c.st == St::Sending => {
                c.st = St::Receiving;
                if self.rec.is_some() {
                    c.track.sent_last = Some(Instant::now());
                }
            }
            Ok(_) => {}
            Err(_) => self.fail(i, Kind::Write),
        }
    }

    /// Reads what is there. `closed`: the peer's FIN (or an error) came with this edge, so
    /// read on to the end of stream even after a short read.
    fn on_readable(&mut self, i: usize, closed: bool) {
        let drain = closed || self.sh.tls.is_some();
        loop {
            let c = &mut self.conns[i];
            let Some(io) = c.io.as_mut() else { return };
            let n = match io.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    if matches!(c.st, St::Sending | St::Receiving) {
                        self.fail(i, Kind::Read);
                    } else {
                        self.drop_conn(i);
                        self.retry.push(i);
                    }
                    return;
                }
            };
            if n == 0 {
                self.on_eof(i);
                return;
            }
            self.r.bytes += n as u64;
            if self.rec.is_some() && matches!(c.st, St::Sending | St::Receiving) {
                c.track.bytes += n as u64;
                if c.track.first_byte.is_none() {
                    c.track.first_byte = Some(Instant::now());
                }
            }
            if self.sh.quickack {
                let _ = SockRef::from(&io.sock).set_tcp_quickack(true);
            }
            if !matches!(c.st, St::Sending | St::Receiving) {
                // Bytes nobody asked for: the connection is out of step; replace it.
                self.drop_conn(i);
                self.retry.push(i);
                return;
            }
            match c.parser.feed(&self.buf[..n]) {
                Err(_) => {
                    self.fail(i, Kind::Read);
                    return;
                }
                Ok(Some(done)) => {
                    // The server's FIN came with the response (it closes after N requests
                    // without saying `Connection: close`): a request sent on this
                    // connection could only fail, so reconnect instead.
                    self.complete(i, done.status, done.close || closed);
                    return;
                }
                Ok(None) => {
                    if !drain && n < self.buf.len() {
                        // Short read: the socket is drained; the next segment raises a new edge.
                        return;
                    }
                }
            }
        }
    }

    fn on_eof(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if matches!(c.st, St::Sending | St::Receiving) {
            if let Some(done) = c.parser.eof() {
                self.complete(i, done.status, true);
            } else {
                self.fail(i, Kind::Read);
            }
        } else {
            // The server closed an idle keep-alive connection: reconnect, not an error.
            self.drop_conn(i);
            if !self.budget_spent() {
                self.retry.push(i);
            }
        }
    }

    fn complete(&mut self, i: usize, status: u16, close: bool) {
        let now = Instant::now();
        self.roll_interval(now);
        let c = &mut self.conns[i];
        let end = us_since(self.sh.start, now);
        let lat = end
            .saturating_sub(us_since(self.sh.start, c.intended))
            .max(1);
        let raw = end.saturating_sub(us_since(self.sh.start, c.sent)).max(1);
        let paced = self.sh.pacing.is_some();
        self.r.hist.saturating_record(lat);
        if paced {
            self.r.uncorrected.saturating_record(raw);
        }
        if c.on_conn == 0 {
            self.r.first.saturating_record(lat);
        }
        if let Some(iv) = &mut self.interval {
            iv.latency.saturating_record(lat);
            if paced {
                iv.uncorrected.saturating_record(raw);
            }
            if c.on_conn == 0 {
                iv.first.saturating_record(lat);
            }
        }
        if self.rec.is_some() {
            self.record(i, now, Some(status), None, false, true);
        }
        let c = &mut self.conns[i];
        c.on_conn += 1;
        self.r.requests += 1;
        self.r.status[usize::from(status).min(999)] += 1;
        if status >= 400 {
            self.r.errors.status += 1;
        }
        c.st = St::Idle;
        if close {
            self.drop_conn(i);
            if !self.budget_spent() {
                self.connect(i, now);
            }
        } else {
            self.start_request(i, now);
        }
    }

    fn start_request(&mut self, i: usize, now: Instant) {
        let c = &mut self.conns[i];
        match c.st {
            St::Closed => {
                self.connect(i, now);
                return;
            }
            St::Idle => {}
            _ => return,
        }
        if self.sh.pacing.is_some() && c.next > now {
            self.timers.push(Reverse((c.next, i, c.generation)));
            return;
        }
        if !self.claim() {
            return;
        }
        let c = &mut self.conns[i];
        c.sent = now;
        c.intended = now;
        if let Some((every, _)) = self.sh.pacing {
            c.intended = c.next;
            c.next += every;
        }
        c.deadline = now + self.sh.timeout;
        c.written = 0;
        c.parser.reset();
        c.st = St::Sending;
        if self.rec.is_some() {
            c.track.sent_first = Some(now);
            c.track.sent_last = None;
            c.track.first_byte = None;
            c.track.bytes = 0;
        }
        let io = c.io.as_mut().expect("idle connection has a socket");
        match io.write_req(self.sh.request, &mut c.written) {
            Ok(true) => {
                c.st = St::Receiving;
                if self.rec.is_some() {
                    c.track.sent_last = Some(now);
                }
            }
            Ok(false) => {}
            Err(_) => self.fail(i, Kind::Write),
        }
    }

    fn drop_conn(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if let Some(mut io) = c.io.take() {
            let _ = self.poll.registry().deregister(&mut io.sock);
        }
        c.st = St::Closed;
        c.generation = c.generation.wrapping_add(1);
    }

    /// A request failed: count it, record it, and replace the connection.
    fn fail(&mut self, i: usize, kind: Kind) {
        let e = &mut self.r.errors;
        let err = match kind {
            Kind::Read => {
                e.read += 1;
                RequestError::Read
            }
            Kind::Write => {
                e.write += 1;
                RequestError::Write
            }
            Kind::Timeout => {
                e.timeout += 1;
                RequestError::Timeout
            }
        };
        if self.rec.is_some() {
            self.record(i, Instant::now(), None, Some(err), false, true);
        }
        self.drop_conn(i);
        self.retry.push(i);
    }

    fn scan_deadlines(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.deadline > now {
                continue;
            }
            match c.st {
                St::Connecting => self.connect_failed(i, now, RequestError::ConnectTimeout),
                St::Sending | St::Receiving => self.fail(i, Kind::Timeout),
                _ => {}
            }
        }
    }

    /// At the run's end: a connect whose handshake completed before its event was read (the
    /// run stopped first) was still opened; the server accepted it, so count it.
    fn count_established(&mut self) {
        for c in &self.conns {
            if c.st == St::Connecting
                && let Some(io) = &c.io
                && matches!(io.sock.take_error(), Ok(None))
                && io.sock.peer_addr().is_ok()
            {
                self.r.connects += 1;
            }
        }
    }

    /// At the run's end: a request in flight, or a connect a request is waiting on, is a
    /// record flagged `pending` (it waited at least until now).
    fn record_pending(&mut self, now: Instant) {
        if self.rec.is_none() {
            return;
        }
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            match c.st {
                St::Sending | St::Receiving => self.record(i, now, None, None, true, true),
                // Without --rate a connection is opened to send a request at once; with it,
                // only once its next send time has come. A spent -n budget wants none.
                St::Connecting
                    if !self.budget_spent() && (self.sh.pacing.is_none() || c.next <= now) =>
                {
                    // The SYN retransmissions so far.
                    let c = &mut self.conns[i];
                    if let Some(io) = &c.io {
                        c.track.syn_retransmits = syn_retransmits(&io.sock);
                    }
                    self.record(i, now, None, None, true, false)
                }
                _ => {}
            }
        }
    }

    /// Makes the record of connection `i`'s current request (`request`) or connect attempt,
    /// ending at `end`, and offers it to the recorder.
    fn record(
        &mut self,
        i: usize,
        end: Instant,
        status: Option<u16>,
        error: Option<RequestError>,
        pending: bool,
        request: bool,
    ) {
        let Some(rec) = self.rec.as_mut() else { return };
        let c = &self.conns[i];
        let t = &c.track;
        let base = self.sh.start;
        let us = |x: Instant| us_since(base, x);
        let start = if !request {
            t.connect_start
        } else if self.sh.pacing.is_some() {
            c.intended
        } else if c.on_conn == 0 {
            t.connect_start
        } else {
            t.sent_first.unwrap_or(c.sent)
        };
        rec.offer(RequestRecord {
            conn: t.conn,
            local: t.local,
            remote: self.sh.addr,
            index: u32::try_from(c.on_conn).unwrap_or(u32::MAX),
            start_us: us(start),
            // From the rounded times, so that `start_us + wait_us` is exactly the end's time.
            wait_us: us(end).saturating_sub(us(start)),
            connect_start_us: us(t.connect_start),
            connect_end_us: t.connect_end.map(us),
            syn_retransmits: t.syn_retransmits,
            intended_us: (request && self.sh.pacing.is_some()).then(|| us(c.intended)),
            sent_first_us: if request { t.sent_first.map(us) } else { None },
            sent_last_us: if request { t.sent_last.map(us) } else { None },
            first_byte_us: if request { t.first_byte.map(us) } else { None },
            last_byte_us: (request && status.is_some()).then(|| us(end)),
            bytes: if request { t.bytes } else { 0 },
            status,
            error,
            pending,
            slow: false,
            weight: 1.0,
        });
    }
}

fn open_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(sock)
}
