//! `slow-server`: the server's own time (request's last byte to response's first byte, less
//! the path) dominates a transaction. Candidates come from finished transactions; whether
//! they are reported is decided at the end, against the same server's usual time.

use std::net::SocketAddr;

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::{Finding, Transaction};

use super::http::Timing;
use super::us;

/// Minimum server time, before `slow-server` is considered at all.
pub const SLOW_SERVER_MIN_US: u64 = 10_000;
/// A server time this long is reported even when it is an exception: below it, a slow
/// transaction is reported only when at least half of the same server's transactions took
/// [`SLOW_SERVER_MIN_US`] or more. A loaded machine deschedules a fast server now and then
/// for a few to a few tens of ms; that is noise, not the server's think time.
pub const SLOW_SERVER_ALONE_US: u64 = 100_000;

/// Per server endpoint: (transactions with a server time, those ≥ [`SLOW_SERVER_MIN_US`]).
#[derive(Default)]
pub(super) struct ServerTimes(super::tracker::FxMap<SocketAddr, (u64, u64)>);

impl ServerTimes {
    /// Counts a finished transaction's think time.
    pub fn note(&mut self, server: SocketAddr, think_us: Option<u64>) {
        if let Some(th) = think_us {
            let e = self.0.entry(server).or_default();
            e.0 += 1;
            e.1 += u64::from(th >= SLOW_SERVER_MIN_US);
        }
    }

    /// A candidate, kept (with the server's record in its explanation) when slow times are
    /// usual for this server or this one is long enough on its own.
    pub fn decide(&self, server: SocketAddr, mut f: Finding) -> Option<Finding> {
        let (n, slow) = self.0.get(&server).copied().unwrap_or((1, 1));
        let usual = slow * 2 >= n;
        if !usual && f.cost_us < SLOW_SERVER_ALONE_US {
            return None;
        }
        let what = if usual { "" } else { "an exception: " };
        f.explanation.push_str(&format!(
            "; {what}{slow} of this server's {n} transactions took ≥ {} ms",
            SLOW_SERVER_MIN_US / 1000
        ));
        Some(f)
    }
}

/// The slow-server candidate of a finished transaction: the server's think time is at
/// least [`SLOW_SERVER_MIN_US`] and half the exchange, and no TCP_CORK wait or loss before
/// the capture point (the response's first copy never seen) explains it.
pub(super) fn candidate(tx: &Transaction, tm: &Timing) -> Option<Finding> {
    let think = tm.think_us;
    let total = us(tm.resp_last_ts - tm.req_first_ts).max(1);
    if tm.has(FindingKind::TcpCork)
        || tm.first_unseen
        || think < SLOW_SERVER_MIN_US
        || think * 2 < total
    {
        return None;
    }
    let at = |ts: i64| tx.start_us + i64::try_from(us(ts - tm.req_first_ts)).unwrap_or(0);
    Some(Finding {
        kind: FindingKind::SlowServer,
        detail: None,
        stream: tx.stream,
        transaction: Some(tx.index),
        frames: [tx.request_last_frame, tx.response_first_frame]
            .into_iter()
            .flatten()
            .collect(),
        start_us: at(tm.req_last_ts),
        end_us: at(tm.resp_first_ts),
        cost_us: think,
        explanation: format!(
            "server took {:.1} ms from the request's last byte to the response's first byte, {:.0}% of the {:.1} ms exchange",
            think as f64 / 1000.0,
            100.0 * think as f64 / total as f64,
            total as f64 / 1000.0
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use super::*;

    fn slow(cost_us: u64) -> Finding {
        Finding {
            kind: FindingKind::SlowServer,
            detail: None,
            stream: 0,
            transaction: Some(0),
            frames: vec![],
            start_us: 0,
            end_us: 0,
            cost_us,
            explanation: String::new(),
        }
    }

    #[test]
    fn an_exception_is_kept_only_when_long() {
        let srv = SocketAddr::from(([10, 0, 0, 2], 80));
        let mut t = ServerTimes::default();
        t.note(srv, Some(50_000));
        for _ in 0..9 {
            t.note(srv, Some(100));
        }
        t.note(srv, None);
        assert!(t.decide(srv, slow(50_000)).is_none());
        let f = t.decide(srv, slow(150_000)).unwrap();
        assert!(
            f.explanation
                .ends_with("; an exception: 1 of this server's 10 transactions took ≥ 10 ms")
        );
    }

    #[test]
    fn usual_slowness_is_kept() {
        let srv = SocketAddr::from(([10, 0, 0, 2], 80));
        let mut t = ServerTimes::default();
        t.note(srv, Some(20_000));
        t.note(srv, Some(100));
        let f = t.decide(srv, slow(20_000)).unwrap();
        assert!(
            f.explanation
                .ends_with("; 1 of this server's 2 transactions took ≥ 10 ms")
        );
    }

    #[test]
    fn think_time_dominating_the_exchange_is_slow_server() {
        let mut s = Script::handshake(100);
        for i in 0..3 {
            let t0 = 1_000 + i * 100_000;
            s.client_data(t0, 41);
            s.server_data(t0 + 20_000, 700);
            s.client_ack(t0 + 20_100);
        }
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::SlowServer; 3]);
        let f = &an.findings[0];
        assert_eq!(f.frames, [4, 5]);
        // The handshake RTT (110 µs, capture next to the client) is the path's, not the
        // server's.
        assert_eq!(f.cost_us, 20_000 - 110);
        assert_eq!((f.start_us, f.end_us), (1_000, 21_000));
        assert_eq!(an.summary[0].transactions_affected, 3);
    }
}
