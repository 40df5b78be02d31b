//! TCP stream tracking, transactions and latency findings.
//!
//! [`Analyzer`] takes frames one at a time (from a file or a live capture) and keeps state
//! only for the streams it has seen: a few counters, the unacknowledged segments of each
//! direction and the current transaction. [`Analyzer::finish`] returns the [`Analysis`].
//!
//! Each TCP segment goes through stages:
//! 1. the tracker (`tracker`: the stream table, as Wireshark's `tcp.stream`; `tcp`: each
//!    connection's sequence and ACK state, retransmission kinds and ACK RTTs) turns it into
//!    an event (`event::Seg`): what the segment means for its connection — data and the
//!    run it continues, an ACK that advanced, a retransmission and its original, windows;
//! 2. the detectors read the event, in a fixed order, each with its own per-stream state:
//!    `window` (zero-window, window-full), `nagle` (Nagle and delayed-ACK stalls), `cork`,
//!    `http` (transactions), `loss` (retransmissions); `server` judges the finished
//!    transactions (slow-server);
//! 3. the recorder (`record`) counts and keeps the findings; `finish` decides the deferred
//!    ones and builds the report.
//!
//! The report types live in `lagtrace_model::analyze` and are re-exported here.

mod copies;
mod cork;
mod dsack;
mod event;
mod hole;
mod http;
mod keep;
mod loss;
mod nagle;
mod record;
mod server;
mod stats;
mod tcp;

#[cfg(test)]
mod testing;
mod timing;
mod tracker;
mod window;

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use cork::CORK_CEILING_US;
pub use keep::{KeepCaps, wait_us};
pub use lagtrace_model::FindingKind;
pub use lagtrace_model::analyze::{
    Analysis, Finding, KindSummary, PacketRecord, ResentToServer, StreamSummary, SynOptions,
    Transaction, TransactionStats, TxnTiming,
};
/// Wireshark-style flag string (`ACK,PSH`, ...); one definition, in `lagtrace-wire`.
pub use lagtrace_wire::tcp::flag_names as flags_str;
pub use loss::{SYN_ACK, SYN_ACK_LOST};
pub use nagle::{DELAYED_ACK_MIN_US, RELEASE_SLACK_US};
pub use server::{SLOW_SERVER_ALONE_US, SLOW_SERVER_MIN_US};
pub use tracker::CLOSED_LINGER_NS;

use event::Seg;
use http::Txn;
use record::Recorder;
use server::ServerTimes;
use tracker::Table;

use crate::wire::{self, Skip, TcpSegment};

/// What to keep besides the summaries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalyzeOptions {
    /// Keep every packet (and its captured payload) of this stream, for `--flow`/`--follow`.
    pub keep_stream: Option<u32>,
    /// Keep at most this many transactions in detail (all are counted).
    pub max_transactions: usize,
    /// Keep at most this many findings in detail (all are counted in the summary).
    pub max_findings: usize,
    /// Also return each transaction's timings ([`Analysis::timings`], up to
    /// `max_transactions`), for joining with a load run's per-request records.
    #[serde(default)]
    pub timings: bool,
    /// With `timings`: keep them in bounded memory instead of the first
    /// `max_transactions` — every wait in histograms, the slowest timings exactly and a
    /// uniform sample of the rest ([`Analysis::timing_keep`]).
    #[serde(default)]
    pub timing_keep: Option<KeepCaps>,
    /// With `timing_keep`: the keys of the requests the load of the same (finished) run
    /// kept; their transactions are kept too, whatever their wait at the capture (a request
    /// slow in the client is fast here).
    #[serde(skip)]
    pub wanted: Option<std::sync::Arc<lagtrace_model::request::WantedKeys>>,
    /// With `timing_keep`: also keep the first this many transactions exactly (weight 0),
    /// a stretch of the run where every transaction is there — what the upstream join
    /// needs to tell which request caused which exchange by time alone.
    #[serde(default)]
    pub keep_first: usize,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            keep_stream: None,
            max_transactions: 100_000,
            max_findings: 100_000,
            timings: false,
            timing_keep: None,
            wanted: None,
            keep_first: 0,
        }
    }
}

/// µs of a non-negative ns duration (0 when negative).
fn us(ns: i64) -> u64 {
    u64::try_from(ns / 1000).unwrap_or(0)
}

/// The detectors' per-stream state.
#[derive(Default)]
struct Detectors {
    window: window::Window,
    nagle: nagle::Nagle,
    http: http::Transactions,
    conn: timing::ConnTimes,
    hole: hole::Stream,
}

/// Frames that were not analyzed, by reason.
#[derive(Default)]
struct Skipped {
    not_ip: u64,
    not_tcp: u64,
    malformed: HashMap<&'static str, u64>,
    unknown_linktypes: HashMap<u32, u64>,
    /// Frames with a timestamp before their predecessor's.
    backwards: u64,
}

impl Skipped {
    fn warnings(&self, out: &mut Vec<String>) {
        if self.not_ip > 0 {
            out.push(format!("{} frames are not IP; skipped", self.not_ip));
        }
        if self.not_tcp > 0 {
            out.push(format!(
                "{} IP frames are not TCP (or are non-first fragments); skipped",
                self.not_tcp
            ));
        }
        let mut lts: Vec<_> = self.unknown_linktypes.iter().collect();
        lts.sort();
        for (lt, n) in lts {
            out.push(format!("{n} frames of unknown link type {lt}; skipped"));
        }
        let mut mal: Vec<_> = self.malformed.iter().collect();
        mal.sort();
        for (why, n) in mal {
            out.push(format!(
                "{n} frames with malformed headers ({why}); skipped"
            ));
        }
        if self.backwards > 0 {
            out.push(format!(
                "{} frames have timestamps earlier than the frame before; gaps around them are clamped to 0",
                self.backwards
            ));
        }
    }
}

/// The clients' data sent again (for [`Analysis::resent_to_server`]).
#[derive(Default)]
struct ClientResent {
    /// Costly retransmissions of the clients' data.
    segments: u64,
    /// Of them, reported received twice (D-SACK).
    dsacked: u64,
    /// The recorder's slots of the first few, to draw an example from.
    slots: Vec<usize>,
}

/// Streaming TCP analyzer.
pub struct Analyzer {
    opts: AnalyzeOptions,
    frames: u64,
    tcp_frames: u64,
    first_ts: Option<i64>,
    last_ts: i64,
    max_ts: i64,
    table: Table<Detectors>,
    transactions: Vec<Transaction>,
    transactions_total: u64,
    timings: Vec<TxnTiming>,
    /// The bounded keep of the timings, with `timing_keep`.
    keep: Option<keep::Keep>,
    rec: Recorder,
    /// Nagle-shaped holds, decided in `finish`: (stream, sender, direction, stall).
    held: Vec<(usize, SocketAddr, usize, nagle::Stall)>,
    /// Per (stream, direction): the first small segment sent while another was unacknowledged.
    unheld: tracker::FxMap<(usize, usize), nagle::Unheld>,
    servers: ServerTimes,
    retrans_frames: Vec<u64>,
    /// Retransmissions the receiver may yet report as received twice.
    dsack: dsack::Dsack,
    /// Segments lost however often resent, and what passed (a PMTU black hole).
    holes: hole::Holes,
    /// The clients' data sent again.
    client_resent: ClientResent,
    /// `(frame, ack_rtt_us)` (Wireshark's `tcp.analysis.ack_rtt`, whole µs).
    ack_rtts_us: Vec<(u64, u64)>,
    /// Per sender: when it last sent data, on which streams (see [`Busy`]).
    busy: tracker::FxMap<SocketAddr, Busy>,
    stream_packets: Vec<PacketRecord>,
    skipped: Skipped,
    /// Packets their senders sent that the capture never saw (IPv4 identifications
    /// skipped), and on how many streams.
    unseen: (i64, tracker::FxMap<usize, i64>),
    warnings: Vec<String>,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new(AnalyzeOptions::default())
    }
}

impl Analyzer {
    /// A fresh analyzer.
    pub fn new(opts: AnalyzeOptions) -> Self {
        let keep = opts
            .timing_keep
            .filter(|_| opts.timings)
            .map(|c| keep::Keep::new(c, opts.wanted.clone(), opts.keep_first));
        Analyzer {
            rec: Recorder::new(opts.max_findings),
            opts,
            frames: 0,
            tcp_frames: 0,
            first_ts: None,
            last_ts: 0,
            max_ts: 0,
            table: Table::new(),
            transactions: Vec::new(),
            transactions_total: 0,
            held: Vec::new(),
            unheld: Default::default(),
            timings: Vec::new(),
            keep,
            servers: ServerTimes::default(),
            retrans_frames: Vec::new(),
            dsack: dsack::Dsack::default(),
            holes: hole::Holes::default(),
            client_resent: ClientResent::default(),
            ack_rtts_us: Vec::new(),
            busy: Default::default(),
            stream_packets: Vec::new(),
            skipped: Skipped::default(),
            unseen: (0, Default::default()),
            warnings: Vec::new(),
        }
    }

    /// Streams whose tracking state is held now (open, or closed less than
    /// [`CLOSED_LINGER_NS`] ago).
    pub fn live_streams(&self) -> usize {
        self.table.live_streams()
    }

    /// Frames fed so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Transactions closed so far.
    pub fn transactions(&self) -> u64 {
        self.transactions_total
    }

    /// Streams seen so far.
    pub fn streams(&self) -> usize {
        self.table.streams.len()
    }

    /// Counts a frame the caller chose not to analyze (another port's), so that frame
    /// numbers stay those of the file.
    pub fn push_skipped(&mut self) {
        self.frames += 1;
    }

    /// Feeds one frame from a [`crate::CaptureReader`].
    pub fn push_frame(&mut self, f: &crate::Frame<'_>) {
        self.push(f.ts_ns, f.len, f.linktype, f.data);
    }

    /// Records a reader warning.
    pub fn warn(&mut self, w: String) {
        if self.warnings.len() < 1000 {
            self.warnings.push(w);
        }
    }

    /// Feeds one captured frame: timestamp (ns since epoch), original length, link type and
    /// captured bytes. Frames are numbered 1, 2, ... in the order fed.
    pub fn push(&mut self, ts_ns: i64, len: u32, linktype: u32, data: &[u8]) {
        let ts_ns = ts_ns.clamp(0, crate::reader::MAX_TS_NS);
        self.frames += 1;
        self.first_ts.get_or_insert(ts_ns);
        if self.frames > 1 && ts_ns < self.last_ts {
            self.skipped.backwards += 1;
        }
        self.last_ts = ts_ns;
        self.max_ts = self.max_ts.max(ts_ns);
        // Free the streams closed long enough ago: memory follows the connections alive in
        // the capture, not its length.
        while let Some(i) = self.table.pop_expired(self.max_ts) {
            self.close_txn(i);
            self.retire(i);
        }
        match wire::decode(linktype, data) {
            Ok(seg) => {
                self.tcp_frames += 1;
                self.segment(ts_ns, len, &seg);
            }
            Err(Skip::NotIp) => self.skipped.not_ip += 1,
            Err(Skip::NotTcp) => self.skipped.not_tcp += 1,
            Err(Skip::UnknownLinkType(l)) => {
                *self.skipped.unknown_linktypes.entry(l).or_default() += 1;
            }
            Err(Skip::Malformed(why)) => *self.skipped.malformed.entry(why).or_default() += 1,
        }
    }

    /// One TCP segment through the stages: tracker, detectors, recorder.
    fn segment(&mut self, ts: i64, frame_len: u32, seg: &TcpSegment<'_>) {
        let frame = self.frames;
        let first_ts = self.first_ts.unwrap_or(ts);
        let i = self.table.lookup(seg, ts, frame, (ts - first_ts) / 1000);
        let Some(ev) = self.table.segment(i, ts, frame, frame_len, first_ts, seg) else {
            return;
        };
        if let Some(rtt) = ev.ack_rtt_ns
            && self.opts.keep_stream == Some(ev.stream)
        {
            self.ack_rtts_us.push((
                frame,
                u64::try_from(rtt.saturating_add(500) / 1000).unwrap_or(0),
            ));
        }
        if ev.unseen > 0 {
            self.unseen.0 += i64::from(ev.unseen);
            *self.unseen.1.entry(i).or_default() += i64::from(ev.unseen);
        }
        if ev.refound > 0 {
            self.unseen.0 -= i64::from(ev.refound);
            *self.unseen.1.entry(i).or_default() -= i64::from(ev.refound);
        }
        let sender = self.table.sender(i, ev.dir);
        let Some(det) = self.table.det_mut(i) else {
            return;
        };
        det.conn.on_segment(&ev);
        det.hole.on_segment(&ev);
        let txn = det.http.open_index();
        let mut found: Vec<Finding> = Vec::new();
        let d = detect(det, &ev, txn, first_ts, &mut found);
        let late = d.late;
        // A stall released late, after the sender sent data on another connection since
        // the ACK: the sender (one worker serving many connections) ran this one when its
        // turn came, which the ACK did not decide — its scheduling, not a delayed ACK.
        let busy = self.busy.entry(sender).or_default();
        if let Some(a) = d.late_ack_ts
            && busy.last_other(ev.stream) > a
        {
            found.retain(|f| f.kind != FindingKind::DelayedAck);
        }
        if ev.len > 0 && ev.retrans.is_none() {
            busy.sent(ev.stream, ev.ts);
        }
        if let Some(u) = d.unheld {
            self.unheld.entry((i, ev.dir)).or_insert(u);
        }
        if let Some(stall) = d.held
            && self.held.len() < self.opts.max_findings
        {
            self.held.push((i, sender, ev.dir, stall));
        }
        let closed = if ev.len > 0 {
            det.http.on_data(&ev, first_ts)
        } else {
            None
        };
        if let Some(t) = closed {
            self.end_txn(i, ev.client, t, ev.server_far_rtt_us, &mut found);
        }
        if let Some(r) = ev.retrans {
            if self.retrans_frames.len() < self.opts.max_findings {
                self.retrans_frames.push(frame);
            }
            // A SYN sent again after the other side's SYN-ACK was captured.
            let st = &self.table.streams[i];
            let answered = ev.flags & wire::flags::SYN != 0
                && ev.flags & wire::flags::ACK == 0
                && if ev.dir == 0 {
                    st.syn_b.is_some()
                } else {
                    st.syn_a.is_some()
                };
            found.push(loss::finding(&ev, r, txn, first_ts, answered));
        }
        if self.opts.keep_stream == Some(ev.stream) {
            self.keep_packet(&ev, first_ts);
        }
        for f in found {
            if f.kind == FindingKind::Retransmission && f.cost_us > 0 {
                let (finding, cost) = self.rec.next_slots(f.kind);
                if ev.dir == ev.client {
                    let c = &mut self.client_resent;
                    c.segments += 1;
                    if let Some(at) = finding.filter(|_| c.slots.len() < 64) {
                        c.slots.push(at);
                    }
                }
                let slots = dsack::Dsack::slots(finding, cost);
                self.dsack
                    .resent(i, ev.dir, seg.seq, seg.payload_len, slots);
            }
            let open = self.table.det_mut(i).and_then(|d| d.http.open.as_mut());
            self.rec.found(i, sender, f, late, open);
        }
        if let Some(block) = seg.options.first_sack
            && seg.flags & crate::wire::flags::ACK != 0
        {
            for r in self.dsack.reported(i, 1 - ev.dir, block, seg.ack) {
                if 1 - ev.dir == ev.client {
                    self.client_resent.dsacked += 1;
                }
                self.rec.spurious(r.slots);
            }
        }
    }

    fn keep_packet(&mut self, ev: &Seg<'_>, first_ts: i64) {
        let gap_us = if self.stream_packets.is_empty() {
            0
        } else {
            us(ev.gap_ns)
        };
        self.stream_packets.push(PacketRecord {
            frame: ev.frame,
            time_us: (ev.ts - first_ts) / 1000,
            a_to_b: ev.dir == 0,
            flags: ev.flags,
            seq: ev.rel_seq,
            ack: ev.rel_ack,
            len: ev.len,
            window: u64::from(ev.win),
            gap_us,
            payload: ev.payload.to_vec(),
            marks: Vec::new(),
        });
    }

    /// Books a finished transaction of stream `i`; its slow-server candidate goes to `out`.
    fn end_txn(
        &mut self,
        i: usize,
        client: usize,
        t: Txn,
        server_far_rtt_us: u64,
        out: &mut Vec<Finding>,
    ) {
        if self.opts.timings
            && (self.keep.is_some() || self.timings.len() < self.opts.max_transactions)
            && let Some(live) = self.table.lives[i].as_deref()
        {
            let first_ts = self.first_ts.unwrap_or(0);
            let st = &self.table.streams[i];
            let far = server_far_rtt_us;
            let tm = timing::of(st, client, &live.det.conn, &t, far, first_ts);
            match &mut self.keep {
                Some(k) => k.offer(tm),
                None => self.timings.push(tm),
            }
        }
        let (tx, timing) = t.close(server_far_rtt_us);
        if let Some(tm) = &timing {
            out.extend(server::candidate(&tx, tm));
        }
        self.servers
            .note(self.table.sender(i, 1 - client), timing.map(|t| t.think_us));
        self.transactions_total += 1;
        self.table.streams[i].transactions += 1;
        if self.transactions.len() < self.opts.max_transactions {
            self.transactions.push(tx);
        }
    }

    /// Finishes the open transaction of stream `i`, if any.
    fn close_txn(&mut self, i: usize) {
        let Some(live) = self.table.lives[i].as_deref_mut() else {
            return;
        };
        let Some(t) = live.det.http.open.take() else {
            return;
        };
        let (client, far) = (live.conn.client.unwrap_or(0), live.conn.server_far_rtt_us());
        let mut found = Vec::new();
        self.end_txn(i, client, t, far, &mut found);
        for f in found {
            self.record(i, f);
        }
    }

    /// Frees stream `i`'s tracking state, its lost segments counted.
    fn retire(&mut self, i: usize) {
        let Some(live) = self.table.lives[i].take() else {
            return;
        };
        let st = &self.table.streams[i];
        let senders = [st.a.ip(), st.b.ip()];
        live.det.hole.finish(st.stream, senders, &mut self.holes);
    }

    fn record(&mut self, i: usize, f: Finding) {
        let open = self.table.det_mut(i).and_then(|d| d.http.open.as_mut());
        self.rec.record(i, f, open);
    }

    /// Ends the analysis and returns the result.
    pub fn finish(mut self) -> Analysis {
        for i in 0..self.table.lives.len() {
            self.close_txn(i);
        }
        self.decide_held();
        // Stalls released late: kept when their sender is seen to stall for the same cause.
        for (i, prompt, mut f) in self.rec.take_late() {
            if prompt > 0 {
                f.explanation.push_str(&format!(
                    "; released later than one RTT after the ACK, kept because this sender has {prompt} such stalls released at once"
                ));
                self.record(i, f);
            }
        }
        // slow-server: now that each server's usual time is known.
        for (i, f) in self.rec.take_slow() {
            let st = &self.table.streams[i];
            let server = if st.a_is_client { st.b } else { st.a };
            if let Some(f) = self.servers.decide(server, f) {
                self.record(i, f);
            }
        }
        self.warnings.extend(self.rec.dropped_warning());
        self.transactions.sort_by_key(|t| (t.stream, t.index));
        let timing_keep = self.keep.take().map(|k| {
            let (kept, keep) = k.finish();
            self.timings = kept;
            keep
        });
        self.timings.sort_by_key(|t| (t.stream, t.index));
        timing::attribute(&mut self.timings, &self.rec.findings);
        self.mark_kept_packets();
        let summary = self.rec.summary(self.transactions_total);
        let mut warnings = std::mem::take(&mut self.warnings);
        self.skipped.warnings(&mut warnings);
        if self.unseen.0 > 0 {
            warnings.push(format!(
                "{} packets on {} streams were sent but never captured (their senders' IPv4 identifications skip them): dropped before the capture point (netfilter, a qdisc, the path) or by the capture itself",
                self.unseen.0,
                self.unseen.1.values().filter(|&&n| n > 0).count()
            ));
        }
        if self.table.copies > 0 {
            warnings.push(format!(
                "{} frames were a second capture of a segment already seen (the capture saw it on two interfaces, or as a GSO super-segment and its pieces); analyzed once",
                self.table.copies
            ));
        }
        let (mid_connection, line) = mid_connection(&self.table.streams);
        warnings.extend(line);
        let first = self.first_ts.unwrap_or(0);
        for i in 0..self.table.lives.len() {
            self.retire(i);
        }
        let black_hole = std::mem::take(&mut self.holes).finish(first);
        let ClientResent {
            segments,
            dsacked,
            slots,
        } = std::mem::take(&mut self.client_resent);
        let resent_to_server = (segments > 0).then(|| ResentToServer {
            segments,
            dsacked,
            example: slots
                .iter()
                .filter_map(|&i| self.rec.findings.get(i))
                .find(|f| f.kind == FindingKind::Retransmission && f.cost_us > 0)
                .cloned(),
        });
        Analysis {
            frames: self.frames,
            tcp_frames: self.tcp_frames,
            first_ts_ns: first,
            duration_us: us(self.max_ts - first),
            mid_connection_streams: mid_connection,
            streams: self.table.streams,
            transactions_total: self.transactions_total,
            transaction_stats: stats::transaction_stats(&self.transactions),
            transactions: self.transactions,
            findings: self.rec.findings,
            summary,
            retransmitted_frames: self.retrans_frames,
            ack_rtts_us: self.ack_rtts_us,
            stream_packets: self.stream_packets,
            warnings,
            timings: self.timings,
            timing_keep,
            black_hole,
            resent_to_server,
        }
    }

    /// Nagle-shaped holds: Nagle, unless the same sender was seen sending small segments
    /// unheld in the same state (its Nagle is off: then a hold with two full segments or
    /// more in flight is its congestion window, and one without is held before the wire).
    fn decide_held(&mut self) {
        for (i, sender, dir, st) in std::mem::take(&mut self.held) {
            match self.unheld.get(&(i, dir)) {
                None => self.rec.found(i, sender, st.finding, st.late, None),
                Some(_) if st.bulk || st.late => {}
                Some(u) => {
                    let f = nagle::held_until_ack(st.finding, u);
                    self.rec.record(i, f, None);
                }
            }
        }
    }

    /// Marks each kept packet with the kinds of the findings it is part of.
    fn mark_kept_packets(&mut self) {
        let Some(ks) = self.opts.keep_stream else {
            return;
        };
        let mut marks: HashMap<u64, Vec<FindingKind>> = HashMap::new();
        for f in self.rec.findings.iter().filter(|f| f.stream == ks) {
            for fr in &f.frames {
                let m = marks.entry(*fr).or_default();
                if !m.contains(&f.kind) {
                    m.push(f.kind);
                }
            }
        }
        for p in &mut self.stream_packets {
            if let Some(m) = marks.remove(&p.frame) {
                p.marks = m;
            }
        }
    }
}

/// When a sender last sent fresh data: on `stream` at `ts`, and on any other stream at
/// `other_ts`.
#[derive(Default)]
struct Busy {
    stream: u32,
    ts: i64,
    other_ts: i64,
}

impl Busy {
    fn sent(&mut self, stream: u32, ts: i64) {
        if stream != self.stream {
            self.other_ts = self.ts;
            self.stream = stream;
        }
        self.ts = ts;
    }

    /// When the sender last sent data on a stream other than `stream`.
    fn last_other(&self, stream: u32) -> i64 {
        if stream == self.stream {
            self.other_ts
        } else {
            self.ts
        }
    }
}

/// What [`detect`] saw besides the findings it handed out.
#[derive(Default)]
struct Detected {
    /// An ACK stall found was released late.
    late: bool,
    /// Its releasing ACK's time.
    late_ack_ts: Option<i64>,
    /// A Nagle-shaped hold, decided at the end.
    held: Option<nagle::Stall>,
    /// The segment left unheld behind an unacknowledged small one.
    unheld: Option<nagle::Unheld>,
}

/// The detectors that read a segment's timing, in order: the order decides which one names
/// a stall.
fn detect(
    det: &mut Detectors,
    ev: &Seg<'_>,
    txn: Option<u32>,
    first_ts: i64,
    found: &mut Vec<Finding>,
) -> Detected {
    let mut out = Detected::default();
    det.nagle.on_ack(ev);
    found.extend(det.window.zero_window(ev, txn, first_ts));
    let Some(data) = ev.data.filter(|_| ev.retrans.is_none()) else {
        return out;
    };
    let small = ev.len < data.mss;
    let (window_limited, full) = det.window.window_full(ev, txn, first_ts);
    found.extend(full);
    match data.prev_same_run {
        // Bytes between the sender's previous data and this segment that the capture never
        // saw (tcpdump dropped them on a loaded machine, or they come later out of order)
        // were sent in between: the time since that data is no wait of this segment.
        Some(p) if tcp::seq_lt(p.end, ev.seq) => {}
        Some(p) => {
            if let Some(s) = det.nagle.stall(ev, p, small, window_limited, txn, first_ts) {
                if s.nagle {
                    out.held = Some(s);
                } else {
                    out.late = s.late;
                    out.late_ack_ts = s.late.then_some(s.ack_ts);
                    found.push(s.finding);
                }
            } else if small {
                found.extend(cork::tail(ev, p, txn, first_ts));
            }
        }
        None => {
            if small && let Some(t) = det.http.open.as_ref() {
                found.extend(cork::first_response(ev, t, first_ts));
            }
        }
    }
    out.unheld = det.nagle.after_data(ev, small);
    det.window.after_data(ev);
    out
}

/// Streams that started before the capture (neither SYN seen), and the one line saying
/// what that leaves unknown, as tshark's "-1 (unknown)" window scale does per stream.
fn mid_connection(streams: &[StreamSummary]) -> (u64, Option<String>) {
    use lagtrace_model::analyze::WindowScale;
    let (mut mid, mut bounded, mut unknown) = (0u64, 0, 0);
    for st in streams
        .iter()
        .filter(|s| s.syn_a.is_none() && s.syn_b.is_none())
    {
        mid += 1;
        for sc in [st.scale_a, st.scale_b] {
            match sc {
                WindowScale::Bounded { .. } => bounded += 1,
                WindowScale::Unknown => unknown += 1,
                WindowScale::Known { .. } => {}
            }
        }
    }
    if mid == 0 {
        return (0, None);
    }
    let line = format!(
        "{mid} of {} streams started before the capture (no handshake seen): their window scale is not known — {bounded} of their sides' windows are bounded below by the bytes in flight, {unknown} read as the raw field (at least that) — so a full window is named only where data ends exactly at the bounded edge; their MSS is taken from runs of equal segments, else the link's (1460, or 65495 on loopback, less 12 with timestamps); their initial RTT is unknown",
        streams.len()
    );
    (mid, Some(line))
}
