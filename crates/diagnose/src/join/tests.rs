//! The join on constructed runs: a true timeline of events, seen by the client (records, on
//! its clock) and by a capture next to it (timings, on a clock `THETA` ahead).

use std::net::SocketAddr;

use lagtrace_model::analyze::TxnTiming;
use lagtrace_model::{RequestError, RequestRecord, RequestRecords};

use super::*;

/// The run's start on the records' `CLOCK_REALTIME`.
const START_UNIX_US: u64 = 1_700_000_000_000_000;
/// The capture's clock runs this far ahead of the records' (µs).
const THETA: i64 = 3_000;
/// The capture's first packet, on its clock: 2 ms before the run started (on that clock).
const FIRST_TS_NS: i64 = (START_UNIX_US as i64 + THETA - 2_000) * 1_000;
/// One way between the client and the capture point (µs).
const WIRE: u64 = 20;

fn server() -> SocketAddr {
    "10.9.0.2:8080".parse().unwrap()
}

/// A record time (µs since the run's start) on the capture's time line.
fn seen(t: u64) -> i64 {
    t as i64 + 2_000
}

/// One request as it really happened.
struct Req {
    port: u16,
    conn: u64,
    stream: u32,
    index: u32,
    /// Connect start and end, for the request that opened its connection.
    connect: Option<(u64, u64)>,
    syns: u32,
    write: u64,
    server: u64,
    /// Response on the wire (first to last byte), and the hold and loss waits inside it.
    transfer: u64,
    hold: u64,
    loss: u64,
}

impl Req {
    fn new(port: u16, stream: u32, index: u32, write: u64, server: u64) -> Req {
        Req {
            port,
            conn: u64::from(port),
            stream,
            index,
            connect: None,
            syns: 0,
            write,
            server,
            transfer: 10,
            hold: 0,
            loss: 0,
        }
    }

    fn client(&self) -> SocketAddr {
        SocketAddr::from(([10, 9, 0, 1], self.port))
    }

    fn record(&self) -> RequestRecord {
        let first = self.write + 2 * WIRE + self.server;
        let last = first + self.transfer;
        let (c0, c1) = self.connect.unwrap_or((0, 0));
        let start = if self.connect.is_some() {
            c0
        } else {
            self.write
        };
        RequestRecord {
            conn: self.conn,
            local: Some(self.client()),
            remote: server(),
            index: self.index,
            start_us: start,
            wait_us: last - start,
            connect_start_us: c0,
            connect_end_us: Some(c1),
            syn_retransmits: Some(self.syns),
            intended_us: None,
            sent_first_us: Some(self.write),
            sent_last_us: Some(self.write),
            first_byte_us: Some(first),
            last_byte_us: Some(last),
            bytes: 100,
            status: Some(200),
            error: None,
            pending: false,
            slow: false,
            weight: 1.0,
        }
    }

    fn timing(&self) -> TxnTiming {
        let rq = seen(self.write + WIRE);
        let rs = rq + self.server as i64;
        let (syn, synack) = match self.connect {
            Some((c0, c1)) => (Some(seen(c0 + WIRE)), Some(seen(c1 - WIRE))),
            None => (None, None),
        };
        TxnTiming {
            stream: self.stream,
            index: self.index,
            client: self.client(),
            server: server(),
            syn_at_us: syn,
            syn_retransmits: self.syns,
            synack_at_us: synack,
            request_first_at_us: Some(rq),
            request_last_at_us: Some(rq),
            response_first_at_us: Some(rs),
            response_last_at_us: Some(rs + self.transfer as i64 - WIRE as i64),
            server_path_us: 0,
            hold_request_us: 0,
            hold_response_us: self.hold,
            loss_request_us: 0,
            loss_response_us: self.loss,
            kinds: Vec::new(),
            weight: 1.0,
        }
    }
}

fn run(reqs: &[Req]) -> (RequestRecords, Vec<TxnTiming>) {
    let records = RequestRecords {
        start_unix_us: START_UNIX_US,
        threads: 1,
        slow_cap: 100,
        sample_cap: 100,
        seen: reqs.len() as u64,
        pending: 0,
        records: reqs.iter().map(Req::record).collect(),
    };
    // The capture's view is in its own order.
    let mut t: Vec<TxnTiming> = reqs.iter().map(Req::timing).collect();
    t.sort_by_key(|t| std::cmp::Reverse((t.stream, t.index)));
    (records, t)
}

/// Two keep-alive connections: a slow server on one request, a Nagle hold and an RTO on
/// others.
fn two_connections() -> Vec<Req> {
    let mut a0 = Req::new(40_001, 0, 0, 1_300, 100);
    a0.connect = Some((1_000, 1_200));
    let a1 = Req::new(40_001, 0, 1, 2_000, 50_000);
    let mut a2 = Req::new(40_001, 0, 2, 60_000, 120);
    a2.transfer = 40_100;
    a2.hold = 40_000;
    let mut b0 = Req::new(40_002, 1, 0, 1_500, 90);
    b0.connect = Some((1_100, 1_400));
    let mut b1 = Req::new(40_002, 1, 1, 3_000, 110);
    b1.transfer = 205_000;
    b1.loss = 204_000;
    vec![a0, a1, a2, b0, b1]
}

#[test]
fn the_clock_offset_is_estimated_from_the_matches_not_assumed() {
    let (records, timings) = run(&two_connections());
    let j = join(&records, FIRST_TS_NS, &timings);
    let o = j.offset.unwrap();
    assert!(o.consistent, "{o:?}");
    assert!(
        (o.theta_us - THETA).abs() <= o.uncertainty_us,
        "{o:?} vs {THETA}"
    );
    assert!(o.uncertainty_us <= WIRE as i64, "{o:?}");
    assert_eq!((j.matched, o.from), (5, 5));
}

#[test]
fn each_request_splits_into_its_measured_components() {
    let reqs = two_connections();
    let (records, timings) = run(&reqs);
    let j = join(&records, FIRST_TS_NS, &timings);
    let parts = |k: usize| j.requests[k].parts;
    // The first request of a connection: the connect, then the exchange.
    let p = parts(0);
    assert_eq!(p.connect_us, 200);
    assert_eq!((p.delivery_us, p.server_us), (WIRE, 100));
    // The response's last byte reached the client at least a wire's time before it was read.
    assert_eq!(p.transfer_us + p.client_read_us, 10 + WIRE);
    assert!(p.client_read_us >= WIRE, "{p:?}");
    // Between the handshake's end and the first write: outside every component.
    assert_eq!(p.unexplained_us, 100);
    // The slow request is server time.
    let p = parts(1);
    assert_eq!(
        (p.server_us, p.connect_us, p.unexplained_us),
        (50_000, 0, 0)
    );
    // The Nagle hold and the RTO wait are their own components, out of the transfer.
    let p = parts(2);
    assert_eq!(
        (p.hold_us, p.transfer_us + p.client_read_us),
        (40_000, 100 + WIRE)
    );
    let p = parts(4);
    assert_eq!(
        (p.loss_us, p.transfer_us + p.client_read_us, p.hold_us),
        (204_000, 1_000 + WIRE, 0)
    );
    for (k, jr) in j.requests.iter().enumerate() {
        let t = &timings[jr.timing.unwrap()];
        assert_eq!((t.client.port(), t.index), (reqs[k].port, reqs[k].index));
        let p = jr.parts;
        let sum = p.connect_us + p.delivery_us + p.server_us + p.hold_us + p.loss_us;
        assert_eq!(
            (sum + p.transfer_us + p.client_read_us) as i64 + p.unexplained_us,
            records.records[k].wait_us as i64
        );
    }
}

#[test]
fn a_reused_port_joins_the_stream_that_started_with_the_connection() {
    let mut reqs = two_connections();
    // Connection 7 reuses port 40001 a second later: another stream on the same 4-tuple.
    let mut r0 = Req::new(40_001, 2, 0, 1_000_300, 30_000);
    r0.conn = 7;
    r0.connect = Some((1_000_000, 1_000_200));
    reqs.push(r0);
    let (records, timings) = run(&reqs);
    let j = join(&records, FIRST_TS_NS, &timings);
    assert_eq!(j.matched, 6);
    let stream_of = |k: usize| timings[j.requests[k].timing.unwrap()].stream;
    assert_eq!(stream_of(0), 0);
    assert_eq!(stream_of(5), 2);
    assert_eq!(j.requests[5].parts.server_us, 30_000);
}

#[test]
fn a_request_the_capture_did_not_see_is_unexplained_but_its_connect() {
    let reqs = two_connections();
    let (mut records, timings) = run(&reqs);
    // A connection the capture missed (another port), and a connect that timed out after
    // two SYN retransmissions.
    let mut missed = Req::new(40_003, 9, 0, 5_300, 70_000).record();
    missed.connect_start_us = 5_000;
    missed.connect_end_us = Some(5_200);
    missed.start_us = 5_000;
    missed.wait_us = 75_400;
    let mut timeout = missed.clone();
    timeout.local = Some("10.9.0.1:40004".parse().unwrap());
    timeout.connect_end_us = Some(3_005_000);
    timeout.wait_us = 3_000_000;
    timeout.syn_retransmits = Some(2);
    timeout.sent_first_us = None;
    timeout.first_byte_us = None;
    timeout.last_byte_us = None;
    timeout.error = Some(RequestError::ConnectTimeout);
    records.records.extend([missed, timeout]);
    let j = join(&records, FIRST_TS_NS, &timings);
    assert_eq!(j.matched, 5);
    let p = j.requests[5].parts;
    assert_eq!(
        (p.connect_us, p.server_us, p.unexplained_us),
        (200, 0, 75_200)
    );
    let t = &j.requests[6].parts;
    assert_eq!((t.connect_us, t.unexplained_us), (3_000_000, 0));
    assert_eq!(t.syn_retransmits, Some(2));
}

#[test]
fn syn_retransmissions_seen_in_the_capture_are_listed_with_the_connect() {
    let mut reqs = two_connections();
    reqs[3].connect = Some((1_100, 1_001_400));
    reqs[3].syns = 1;
    reqs[3].write = 1_001_500;
    reqs[4].write = 1_003_000;
    let (records, timings) = run(&reqs);
    let j = join(&records, FIRST_TS_NS, &timings);
    assert_eq!(j.requests[3].parts.connect_us, 1_000_300);
    assert_eq!(j.requests[3].parts.syn_retransmits, Some(1));
    assert_eq!(j.requests[4].parts.syn_retransmits, None);
}

#[test]
fn nothing_to_join_gives_no_offset() {
    let (records, _) = run(&two_connections());
    let j = join(&records, FIRST_TS_NS, &[]);
    assert_eq!((j.offset, j.matched), (None, 0));
    assert!(j.requests.iter().all(|r| r.timing.is_none()));
}
