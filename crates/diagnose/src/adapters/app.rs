//! Layer 2: a `lagtrace_load` report → [`AppRun`].

use lagtrace_load::{LatencySummary, LoadReport};
use lagtrace_model::{RequestError, RequestRecord, RequestRecords};

use crate::evidence::{AppRun, ConnectStats, Errors, PercentilePoint, Percentiles};

/// The slowest records a run keeps in the diagnosis: every one at or above its p99 in runs
/// of up to 100 000 requests (about 0.6 kB of JSON each with its join). Fewer would cut the
/// p99 set itself, and the sampled records standing for the rest would then be read as
/// part of it (a 30 000-request run kept 200 of its 300: the tail split then averaged a
/// 9 ms request weighing 600 into a 210 ms tail).
pub const TAIL_KEEP: usize = 1000;
/// The sample of the other records a run keeps in the diagnosis (the typical request's
/// parts, and the quantiles the split reads below the tail).
pub const BODY_KEEP: usize = 200;

fn pct(l: &LatencySummary) -> Percentiles {
    Percentiles {
        count: l.count,
        min_us: l.min,
        mean_us: l.mean.round().max(0.0) as u64,
        p50_us: l.p50,
        p90_us: l.p90,
        p99_us: l.p99,
        p999_us: l.p999,
        max_us: l.max,
    }
}

/// One load run as evidence.
pub fn run(concurrency: u32, r: &LoadReport) -> AppRun {
    let first = (r.first_request_latency_us.count > 0).then(|| pct(&r.first_request_latency_us));
    let later = (r.later_request_latency_us.count > 0).then(|| pct(&r.later_request_latency_us));
    AppRun {
        concurrency,
        requests: r.latency_us.count,
        duration_us: (r.duration_s * 1e6) as u64,
        requests_per_sec: r.requests_per_sec,
        latency: pct(&r.latency_us),
        distribution: if r.latency_us.count > 0 {
            r.percentiles
                .iter()
                .map(|p| PercentilePoint {
                    percentile: p.percentile,
                    latency_us: p.latency_us,
                })
                .collect()
        } else {
            Vec::new()
        },
        errors: Errors {
            connect: r.errors.connect,
            read: r.errors.read,
            write: r.errors.write,
            timeout: r.errors.timeout,
            status: r.errors.status,
        },
        first_request: first,
        bytes: r.bytes,
        later_requests: later,
        waits: r.records.as_ref().map(|x| waits(&x.records)),
        connects: r.records.as_ref().map(|x| connects(&x.records)),
        records: r
            .records
            .as_ref()
            .map(|x| trim(x, waits(&x.records).p99_us)),
        client_cpu: None,
        passive: None,
    }
}

/// Weighted percentiles of `(value, weight)` pairs; `count` is the total weight, rounded.
fn weighted(mut v: Vec<(u64, f64)>) -> Percentiles {
    v.sort_by_key(|x| x.0);
    let total: f64 = v.iter().map(|x| x.1).sum();
    if v.is_empty() || total <= 0.0 {
        return Percentiles::default();
    }
    let at = |q: f64| {
        let want = q * total;
        let mut cum = 0.0;
        for &(x, w) in &v {
            cum += w;
            if cum >= want {
                return x;
            }
        }
        v[v.len() - 1].0
    };
    let mean = v.iter().map(|x| x.0 as f64 * x.1).sum::<f64>() / total;
    Percentiles {
        count: total.round() as u64,
        min_us: v[0].0,
        mean_us: mean.round() as u64,
        p50_us: at(0.5),
        p90_us: at(0.9),
        p99_us: at(0.99),
        p999_us: at(0.999),
        max_us: v[v.len() - 1].0,
    }
}

/// Every request's wait (connects, failures and pending ones included), weighted.
pub fn waits(records: &[RequestRecord]) -> Percentiles {
    weighted(records.iter().map(|r| (r.wait_us, r.weight)).collect())
}

/// Whether a record carries its connection's connect: the first request of a connection,
/// a failed connect, or a connect still pending.
pub fn is_connect(r: &RequestRecord) -> bool {
    r.index == 0
}

/// How long the record's connect took: until the handshake, the failure or the run's end.
pub fn connect_time_us(r: &RequestRecord) -> u64 {
    r.connect_end_us
        .unwrap_or(r.start_us + r.wait_us)
        .saturating_sub(r.connect_start_us)
}

/// Whether the record's connect waited for a SYN retransmission.
pub fn syn_retransmitted(r: &RequestRecord) -> bool {
    is_connect(r)
        && (r.syn_retransmits.unwrap_or(0) > 0 || connect_time_us(r) >= ConnectStats::SYN_RTO_US)
}

/// Connection setup over the records, weighted.
pub fn connects(records: &[RequestRecord]) -> ConnectStats {
    let c: Vec<&RequestRecord> = records.iter().filter(|r| is_connect(r)).collect();
    let count = |f: &dyn Fn(&RequestRecord) -> bool| {
        c.iter()
            .filter(|r| f(r))
            .map(|r| r.weight)
            .sum::<f64>()
            .round() as u64
    };
    ConnectStats {
        attempts: count(&|_| true),
        syn_retransmitted: count(&syn_retransmitted),
        failed: count(&|r| {
            matches!(
                r.error,
                Some(RequestError::ConnectRefused | RequestError::ConnectTimeout)
                    | Some(RequestError::Connect)
            )
        }),
        pending: count(&|r| r.pending && r.connect_end_us.is_none()),
        time: weighted(c.iter().map(|r| (connect_time_us(r), r.weight)).collect()),
    }
}

/// The records a diagnosis keeps: the [`TAIL_KEEP`] slowest at or above `p99_us`, and a
/// systematic sample by weight of [`BODY_KEEP`] of the others (in time order, each picked
/// record standing for the weight it covers, so `Σ weight` is unchanged).
pub fn trim(all: &RequestRecords, p99_us: u64) -> RequestRecords {
    let mut tail: Vec<usize> = (0..all.records.len())
        .filter(|&i| all.records[i].wait_us >= p99_us)
        .collect();
    tail.sort_by_key(|&i| std::cmp::Reverse(all.records[i].wait_us));
    tail.truncate(TAIL_KEEP);
    let mut keep = vec![false; all.records.len()];
    for &i in &tail {
        keep[i] = true;
    }
    let rest: Vec<&RequestRecord> = all
        .records
        .iter()
        .zip(&keep)
        .filter(|(_, k)| !**k)
        .map(|(r, _)| r)
        .collect();
    let mut out: Vec<RequestRecord> = tail.iter().map(|&i| all.records[i].clone()).collect();
    out.extend(sample(&rest, BODY_KEEP));
    out.sort_by_key(|r| (r.start_us, r.conn, r.index));
    RequestRecords {
        start_unix_us: all.start_unix_us,
        threads: all.threads,
        slow_cap: all.slow_cap,
        sample_cap: all.sample_cap,
        seen: all.seen,
        pending: all.pending,
        records: out,
    }
}

/// A systematic sample of `n` records by weight: points `(k + ½) × W / n` on the
/// cumulative weight pick the record they fall in; a record picked by several points
/// stands for all of them.
fn sample(rest: &[&RequestRecord], n: usize) -> Vec<RequestRecord> {
    if rest.len() <= n {
        return rest.iter().map(|r| (*r).clone()).collect();
    }
    let total: f64 = rest.iter().map(|r| r.weight).sum();
    let step = total / n as f64;
    let mut out: Vec<RequestRecord> = Vec::with_capacity(n);
    let (mut cum, mut k) = (0.0, 0usize);
    for r in rest {
        cum += r.weight;
        let mut picks = 0;
        while k < n && (k as f64 + 0.5) * step < cum {
            picks += 1;
            k += 1;
        }
        if picks > 0 {
            let mut x = (*r).clone();
            x.weight = step * f64::from(picks);
            x.slow = false;
            out.push(x);
        }
    }
    out
}

/// A run that could not start (nothing listening, connect timeout): one connect error.
pub fn failed(concurrency: u32) -> AppRun {
    AppRun {
        concurrency,
        errors: Errors {
            connect: 1,
            ..Errors::default()
        },
        ..AppRun::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(conn: u64, index: u32, start_us: u64, wait_us: u64, weight: f64) -> RequestRecord {
        RequestRecord {
            conn,
            local: None,
            remote: "10.0.0.2:80".parse().unwrap(),
            index,
            start_us,
            wait_us,
            connect_start_us: start_us,
            connect_end_us: Some(start_us + if index == 0 { wait_us / 2 } else { 0 }),
            syn_retransmits: Some(0),
            intended_us: None,
            sent_first_us: None,
            sent_last_us: None,
            first_byte_us: None,
            last_byte_us: None,
            bytes: 0,
            status: Some(200),
            error: None,
            pending: false,
            slow: weight == 1.0,
            weight,
        }
    }

    #[test]
    fn trimming_keeps_the_tail_exactly_and_the_total_weight() {
        // 1000 fast sampled records standing for 10 each, 300 slow ones.
        let mut all = RequestRecords {
            seen: 10_300,
            ..RequestRecords::default()
        };
        for i in 0..1000 {
            all.records.push(rec(i, 1, i * 10, 100 + i % 7, 10.0));
        }
        for i in 0..300 {
            all.records.push(rec(2000 + i, 1, i * 33, 50_000 + i, 1.0));
        }
        let w = waits(&all.records);
        assert_eq!(w.count, 10_300);
        assert!(w.p50_us < 200 && w.p99_us >= 50_000, "{w:?}");
        let t = trim(&all, w.p99_us);
        assert!(t.records.len() <= TAIL_KEEP + BODY_KEEP);
        let total: f64 = t.records.iter().map(|r| r.weight).sum();
        assert!((total - 10_300.0).abs() < 1e-6, "{total}");
        // Every record at or above the p99 is there, weight 1.
        let above = |r: &&RequestRecord| r.wait_us >= w.p99_us;
        let slow: Vec<_> = t.records.iter().filter(above).collect();
        assert_eq!(slow.len(), all.records.iter().filter(above).count());
        assert!(slow.len() > 100 && slow.iter().all(|r| r.weight == 1.0));
        // The trimmed set estimates the same median.
        assert!(waits(&t.records).p50_us < 200);
    }

    #[test]
    fn a_connect_that_waited_the_initial_rto_counts_as_a_syn_retransmission() {
        let mut a = rec(0, 0, 0, 2_100_000, 1.0);
        a.syn_retransmits = None;
        let mut b = rec(1, 0, 0, 800, 1.0);
        b.syn_retransmits = Some(1);
        let c = rec(2, 0, 0, 400, 1.0);
        let mut d = rec(3, 0, 0, 1_500_000, 1.0);
        d.connect_end_us = None;
        d.pending = true;
        d.status = None;
        let s = connects(&[a, b, c, d, rec(0, 1, 5, 100, 1.0)]);
        assert_eq!((s.attempts, s.syn_retransmitted, s.pending), (4, 3, 1));
        assert_eq!(s.time.max_us, 1_500_000);
    }
}
