//! Transactions: request/response exchanges on a stream. The client's data opens a
//! transaction (closing the previous one once it has a response), the server's data is its
//! response; HTTP/1.x request and status lines are read when present.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Transaction;

use super::event::Seg;
use super::us;

/// The open transaction of a stream, with its raw times.
pub(super) struct Txn {
    /// What will be reported.
    pub t: Transaction,
    /// Kinds of the findings recorded against it (bit [`FindingKind::index`]).
    pub kinds: u16,
    req_first_ts: i64,
    req_last_ts: i64,
    /// When the response started, once it has.
    pub resp_first_ts: Option<i64>,
    /// Packets of the server the capture never saw came just before the response's first
    /// segment: its first copy was lost before the capture point.
    resp_first_unseen: bool,
    resp_last_ts: i64,
}

/// When a finished transaction's request and response went by, ns since the epoch, and what
/// it cost the server: kept for per-request views (the request ⋈ packets join).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Timing {
    pub req_first_ts: i64,
    pub req_last_ts: i64,
    pub resp_first_ts: i64,
    pub resp_last_ts: i64,
    /// Server time less the part of the path RTT it includes, µs.
    pub think_us: u64,
    /// The response's first segment came after server packets the capture never saw: the
    /// server time includes the recovery of a loss before the capture point.
    pub first_unseen: bool,
    /// Kinds of the findings recorded against it.
    pub kinds: u16,
}

impl Timing {
    /// Whether a finding of `k` was recorded against the transaction.
    pub fn has(&self, k: FindingKind) -> bool {
        self.kinds & (1 << k.index()) != 0
    }
}

impl Txn {
    fn new(ev: &Seg<'_>, index: u32, request: bool, first_ts: i64) -> Txn {
        let frame = request.then_some(ev.frame);
        Txn {
            t: Transaction {
                stream: ev.stream,
                index,
                request_line: if request {
                    request_line(ev.payload)
                } else {
                    None
                },
                status: None,
                request_bytes: 0,
                response_bytes: 0,
                request_first_frame: frame,
                request_last_frame: frame,
                response_first_frame: None,
                response_last_frame: None,
                start_us: (ev.ts - first_ts) / 1000,
                time_to_first_byte_us: None,
                time_to_last_byte_us: None,
                server_time_us: None,
            },
            kinds: 0,
            req_first_ts: ev.ts,
            req_last_ts: ev.ts,
            resp_first_ts: None,
            resp_first_unseen: false,
            resp_last_ts: ev.ts,
        }
    }

    /// Request first and last, response first and last byte times (ns since the epoch), as
    /// far as they were seen.
    pub fn times(&self) -> [Option<i64>; 4] {
        let req = self.t.request_first_frame.is_some();
        let resp = self.resp_first_ts.is_some();
        [
            req.then_some(self.req_first_ts),
            req.then_some(self.req_last_ts),
            self.resp_first_ts,
            resp.then_some(self.resp_last_ts),
        ]
    }

    /// Marks a finding kind as recorded against it; false if it already was.
    pub fn mark(&mut self, k: FindingKind) -> bool {
        let bit = 1u16 << k.index();
        let new = self.kinds & bit == 0;
        self.kinds |= bit;
        new
    }

    /// The finished transaction, with its timing when it has both a request and a response.
    /// `server_far_rtt_us`: the path RTT inside the server time (capture near the client).
    pub fn close(self, server_far_rtt_us: u64) -> (Transaction, Option<Timing>) {
        let mut tx = self.t;
        let Some(rf) = self
            .resp_first_ts
            .filter(|_| tx.request_first_frame.is_some())
        else {
            return (tx, None);
        };
        tx.time_to_first_byte_us = Some(us(rf - self.req_first_ts));
        tx.time_to_last_byte_us = Some(us(self.resp_last_ts - self.req_first_ts));
        let server = us(rf - self.req_last_ts);
        tx.server_time_us = Some(server);
        let timing = Timing {
            req_first_ts: self.req_first_ts,
            req_last_ts: self.req_last_ts,
            resp_first_ts: rf,
            resp_last_ts: self.resp_last_ts,
            think_us: server.saturating_sub(server_far_rtt_us),
            first_unseen: self.resp_first_unseen,
            kinds: self.kinds,
        };
        (tx, Some(timing))
    }
}

/// Per-stream state: the open transaction.
#[derive(Default)]
pub(super) struct Transactions {
    /// The open transaction.
    pub open: Option<Txn>,
    count: u32,
}

impl Transactions {
    /// Index of the open transaction.
    pub fn open_index(&self) -> Option<u32> {
        self.open.as_ref().map(|t| t.t.index)
    }

    /// A segment with payload: returns the transaction it closes, if any.
    pub fn on_data(&mut self, ev: &Seg<'_>, first_ts: i64) -> Option<Txn> {
        let fresh = ev.retrans.is_none();
        let len = u64::from(ev.len);
        if ev.dir != ev.client {
            // The server sending again what it sent before the open request (its ACK of
            // the previous response was lost, or the request carrying that ACK was dropped):
            // the previous response's data, not the start of this one's. The request's own
            // copy sent again may still follow and is where the server's time starts.
            let awaiting = self
                .open
                .as_ref()
                .is_some_and(|t| t.resp_first_ts.is_none() && t.t.request_first_frame.is_some());
            if !fresh && awaiting {
                return None;
            }
            if self.open.is_none() {
                self.open = Some(Txn::new(ev, self.count, false, first_ts));
                self.count += 1;
            }
            if let Some(t) = self.open.as_mut() {
                if t.resp_first_ts.is_none() {
                    t.resp_first_ts = Some(ev.ts);
                    t.resp_first_unseen = ev.unseen > 0;
                    t.t.response_first_frame = Some(ev.frame);
                    t.t.status = status_code(ev.payload);
                }
                t.t.response_bytes += len;
                t.t.response_last_frame = Some(ev.frame);
                t.resp_last_ts = ev.ts;
            }
            return None;
        }
        let mut closed = None;
        let answered = self.open.as_ref().is_none_or(|t| t.resp_first_ts.is_some());
        if answered && fresh {
            closed = self.open.take();
            self.open = Some(Txn::new(ev, self.count, true, first_ts));
            self.count += 1;
        }
        if let Some(t) = self.open.as_mut()
            && t.resp_first_ts.is_none()
        {
            if fresh {
                t.t.request_bytes += len;
            }
            // A retransmitted request reaches the server only now: the server's time
            // starts here, the wait before it belongs to the retransmission.
            t.t.request_last_frame = Some(ev.frame);
            t.req_last_ts = ev.ts;
        }
        closed
    }
}

/// The HTTP/1.x request line a payload starts with.
pub(super) fn request_line(p: &[u8]) -> Option<String> {
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"HEAD ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    if !METHODS.iter().any(|m| p.starts_with(m)) {
        return None;
    }
    let end = p
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(p.len());
    let line = &p[..end.min(200)];
    let s = std::str::from_utf8(line).ok()?;
    if end < p.len() && !s.contains(" HTTP/1.") {
        return None;
    }
    Some(s.to_string())
}

/// The status code of an HTTP/1.x status line a payload starts with.
pub(super) fn status_code(p: &[u8]) -> Option<u16> {
    if p.len() >= 12 && p.starts_with(b"HTTP/1.") && p[8] == b' ' {
        std::str::from_utf8(&p[9..12]).ok()?.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Script;
    use super::*;
    use crate::wire::flags;

    #[test]
    fn http_lines() {
        assert_eq!(
            request_line(b"GET / HTTP/1.1\r\nHost: x\r\n").as_deref(),
            Some("GET / HTTP/1.1")
        );
        assert_eq!(request_line(b"\x16\x03\x01"), None);
        assert_eq!(request_line(b"GET /a b\r\n"), None, "not HTTP/1.x");
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.1 20"), None);
    }

    #[test]
    fn keep_alive_exchanges_are_separate_transactions() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        s.server_data(1_600, 615);
        s.client_data(3_000, 41);
        s.server_data(3_200, 853);
        let an = s.finish();
        assert_eq!(an.transactions_total, 2);
        let t = &an.transactions;
        assert_eq!(t[0].request_line.as_deref(), Some("GET / HTTP/1.1"));
        assert_eq!(t[0].status, Some(200));
        assert_eq!((t[0].request_bytes, t[0].response_bytes), (41, 853));
        assert_eq!(
            (t[0].request_first_frame, t[0].response_last_frame),
            (Some(4), Some(6))
        );
        assert_eq!(t[0].time_to_first_byte_us, Some(500));
        assert_eq!(t[0].time_to_last_byte_us, Some(600));
        assert_eq!(t[0].server_time_us, Some(500));
        assert_eq!(t[1].index, 1);
        assert_eq!(t[1].server_time_us, Some(200));
        assert_eq!(an.streams[0].transactions, 2);
        assert_eq!(an.transaction_stats.complete, 2);
    }

    /// The request that carried the client's ACK of the previous response is lost after
    /// the capture point: the server sends that response again (its data, not this
    /// request's answer), then the client's copy of the request arrives and is answered.
    #[test]
    fn a_previous_response_sent_again_is_not_the_start_of_the_next() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 40);
        s.server_data(1_100, 853);
        s.client_data(1_200, 40);
        // The server never had the request: its copy acknowledges only the first.
        s.raw(
            205_000,
            false,
            flags::PSH | flags::ACK,
            5_000,
            1_040,
            &[b'y'; 853],
        );
        s.client_resend(205_100, 40);
        s.server_data(205_200, 853);
        let an = s.finish();
        let t = &an.transactions[1];
        assert_eq!(
            (
                t.request_first_frame,
                t.request_last_frame,
                t.response_first_frame
            ),
            (Some(6), Some(8), Some(9)),
            "{t:?}"
        );
        assert_eq!(t.server_time_us, Some(100));
        assert_eq!(t.response_bytes, 853);
        let r = an.resent_to_server.as_ref().expect("the client's resend");
        assert_eq!((r.segments, r.dsacked, r.not_dsacked()), (1, 0, 1));
        assert_eq!(
            r.example.as_ref().map(|f| f.frames.clone()),
            Some(vec![6, 8])
        );
    }

    #[test]
    fn a_response_without_a_request_has_no_times() {
        let mut s = Script::handshake(100);
        s.server_data(1_000, 100);
        let an = s.finish();
        assert_eq!(an.transactions_total, 1);
        assert_eq!(an.transactions[0].request_first_frame, None);
        assert_eq!(an.transactions[0].time_to_first_byte_us, None);
    }
}
