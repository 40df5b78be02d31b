//! The tail split and its mechanisms on constructed runs: keep-alive connections whose
//! requests pay a cost on a pattern (every n-th, a process-wide pause) or at random.

use lagtrace_model::{RequestRecord, RequestRecords};

use super::super::{Join, Joined, Parts};
use super::*;

/// One request: connection, index, when it started, and its parts (server time, loss).
struct R {
    conn: u64,
    index: u32,
    start: u64,
    server: u64,
    loss: u64,
}

const FAST: u64 = 150;

fn build(rs: &[R]) -> (RequestRecords, Join) {
    let mut records = Vec::new();
    let mut requests = Vec::new();
    for (k, r) in rs.iter().enumerate() {
        let parts = Parts {
            delivery_us: 20,
            server_us: r.server,
            loss_us: r.loss,
            transfer_us: 30,
            ..Parts::default()
        };
        let wait = 50 + r.server + r.loss;
        records.push(RequestRecord {
            conn: r.conn,
            local: None,
            remote: "10.0.0.2:80".parse().unwrap(),
            index: r.index,
            start_us: r.start,
            wait_us: wait,
            connect_start_us: 0,
            connect_end_us: Some(0),
            syn_retransmits: Some(0),
            intended_us: None,
            sent_first_us: Some(r.start),
            sent_last_us: Some(r.start),
            first_byte_us: Some(r.start + 20 + r.server + r.loss),
            last_byte_us: Some(r.start + wait),
            bytes: 10,
            status: Some(200),
            error: None,
            pending: false,
            slow: false,
            weight: 1.0,
        });
        requests.push(Joined {
            record: k,
            timing: Some(k),
            parts,
        });
    }
    let recs = RequestRecords {
        seen: records.len() as u64,
        records,
        ..RequestRecords::default()
    };
    let j = Join {
        offset: None,
        matched: requests.len(),
        captured_until_us: None,
        requests,
    };
    (recs, j)
}

/// `conns` connections, each sending back to back for `dur_us`; `cost(conn, index, t)`
/// gives the server time of a request starting at `t`.
fn closed_loop(conns: u64, dur_us: u64, cost: &dyn Fn(u64, u32, u64) -> u64) -> Vec<R> {
    let mut v = Vec::new();
    let mut seed = 3u64;
    for c in 0..conns {
        // Connections start a little apart, as a load client's do.
        let (mut t, mut i) = (c * 37, 0);
        while t < dur_us {
            let server = cost(c, i, t);
            v.push(R {
                conn: c,
                index: i,
                start: t,
                server,
                loss: 0,
            });
            // The client's own time between requests varies (scheduling).
            t += 50 + server + 10 + lcg(&mut seed) % 100;
            i += 1;
        }
    }
    v
}

#[test]
fn every_tenth_request_of_a_connection_is_server_time_on_every_nth() {
    let rs = closed_loop(4, 2_000_000, &|_, i, _| {
        if i % 10 == 9 { 40_000 } else { FAST }
    });
    let (recs, j) = build(&rs);
    let s = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.parts[0].component, Component::Server);
    assert!(s.parts[0].share > 0.95, "{s:?}");
    assert!((39_000..=40_000).contains(&s.excess_us), "{s:?}");
    let e = s.every_nth.expect("every-nth");
    assert_eq!((e.n, e.residue), (10, 9));
    assert!(e.hit_there > 0.99 && e.hit_elsewhere < 0.01, "{e:?}");
    assert!(s.pause.is_none(), "{:?}", s.pause);
}

#[test]
fn a_process_wide_pause_every_300_ms_is_periodic_with_its_period() {
    // The server stops for 60 ms every 300 ms: a request arriving during the pause waits
    // for its end.
    let pause = |t: u64| {
        let k = t % 300_000;
        if (100_000..160_000).contains(&k) {
            160_000 - k + FAST
        } else {
            FAST
        }
    };
    let rs = closed_loop(8, 3_000_000, &|_, _, t| pause(t));
    let (recs, j) = build(&rs);
    let s = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.parts[0].component, Component::Server);
    let p = s.pause.expect("a pause");
    assert!((290_000..=310_000).contains(&p.period_us), "{p:?}");
    assert!(p.stalls >= 9 && p.connections == 8, "{p:?}");
    assert!(s.every_nth.is_none(), "{:?}", s.every_nth);
}

#[test]
fn three_stalls_in_one_burst_of_a_long_run_are_no_periodic_pause() {
    // The same pauses, but only three of them, in the run's first second of three (another
    // process's burst of kernel work, then nothing): an event, not a period.
    let pause = |t: u64| {
        let k = t % 300_000;
        if t < 1_000_000 && (100_000..160_000).contains(&k) {
            160_000 - k + FAST
        } else {
            FAST
        }
    };
    let rs = closed_loop(8, 3_000_000, &|_, _, t| pause(t));
    let (recs, j) = build(&rs);
    let s = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.parts[0].component, Component::Server);
    assert!(s.pause.is_none(), "{:?}", s.pause);
}

/// A deterministic pseudo-random sequence (an LCG).
fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn random_losses_show_as_loss_recovery_with_no_mechanism() {
    let mut seed = 7u64;
    let mut rs = closed_loop(4, 2_000_000, &|_, _, _| FAST);
    for r in &mut rs {
        if lcg(&mut seed).is_multiple_of(50) {
            r.loss = 200_000 + lcg(&mut seed) % 20_000;
        }
    }
    let (recs, j) = build(&rs);
    let s = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.parts[0].component, Component::Loss);
    assert!(s.parts[0].share > 0.95, "{s:?}");
    assert!(s.every_nth.is_none(), "{:?}", s.every_nth);
    assert!(s.pause.is_none(), "{:?}", s.pause);
}

#[test]
fn slow_requests_at_random_on_one_connection_at_a_time_are_no_pause() {
    let mut seed = 11u64;
    let mut rs = closed_loop(4, 2_000_000, &|_, _, _| FAST);
    for r in &mut rs {
        if lcg(&mut seed).is_multiple_of(30) {
            r.server = 30_000;
        }
    }
    let (recs, j) = build(&rs);
    let s = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.parts[0].component, Component::Server);
    assert!(s.pause.is_none(), "{:?}", s.pause);
    assert!(s.every_nth.is_none(), "{:?}", s.every_nth);
}

#[test]
fn the_weighted_quantile_counts_what_a_sampled_record_stands_for() {
    let v = [(10, 98.0), (20, 1.0), (1_000, 1.0)];
    assert_eq!(quantile(&v, 0.5), 10);
    assert_eq!(quantile(&v, 0.99), 20);
    assert_eq!(quantile(&v, 1.0), 1_000);
}

/// The diagnosis keeps the p99 set exactly and a heavy sample of the rest
/// ([`crate::adapters::app::trim`]): the split of the kept records must give the same tail
/// as the split of them all — a sampled record standing for hundreds of fast requests is not
/// part of the slowest 1 %, also when the run is so long that the kept tail was cut to its
/// slowest.
#[test]
fn the_kept_records_split_like_the_whole_run_however_long_it_is() {
    for conns in [4, 16] {
        let mut seed = 5u64;
        let mut rs = closed_loop(conns, 2_500_000, &|_, _, _| FAST);
        for r in &mut rs {
            if lcg(&mut seed).is_multiple_of(50) {
                r.loss = 200_000 + lcg(&mut seed) % 20_000;
            }
        }
        let (all, j) = build(&rs);
        let whole = split(&all.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
        let by_key: std::collections::HashMap<(u64, u32), Parts> = all
            .records
            .iter()
            .zip(j.parts())
            .map(|(r, p)| ((r.conn, r.index), p))
            .collect();
        let p99 = whole.at_us;
        let kept = crate::adapters::app::trim(&all, p99);
        assert!(
            kept.records.len() < all.records.len() / 10,
            "{}",
            kept.records.len()
        );
        let parts: Vec<Parts> = kept
            .records
            .iter()
            .map(|r| by_key[&(r.conn, r.index)])
            .collect();
        let seen = vec![true; parts.len()];
        let s = split(&kept.records, &parts, &seen, 99.0, None).unwrap();
        assert_eq!(s.parts[0].component, Component::Loss, "{s:?}");
        assert!(s.parts[0].share > 0.95, "{s:?}");
        // The slowest 1 % waited ~210 ms for their retransmission, each of them.
        assert!(
            s.parts[0].added_us > 190_000,
            "{} requests: {s:?}",
            rs.len()
        );
        assert!(s.at_us >= 200_000, "{s:?}");
    }
}

/// A sampled record stands for the requests around its rank, not above the percentile: when
/// the exactly kept tail is less than the percentile's share (a kept tail cut to its
/// slowest), the quantile falls on a sampled record, which must not join the slow set and
/// weigh a 9 ms body into a 210 ms tail.
#[test]
fn a_heavy_sampled_record_at_the_percentile_is_not_part_of_the_tail() {
    let mut rs: Vec<R> = (0..100)
        .map(|k| R {
            conn: k,
            index: 0,
            start: k * 1000,
            server: FAST,
            loss: 0,
        })
        .collect();
    rs.push(R {
        conn: 100,
        index: 0,
        start: 0,
        server: 9_000,
        loss: 0,
    });
    for k in 0..10 {
        rs.push(R {
            conn: 200 + k,
            index: 0,
            start: k * 1000,
            server: FAST,
            loss: 210_000,
        });
    }
    let (mut all, j) = build(&rs);
    for r in &mut all.records[..100] {
        r.weight = 100.0;
    }
    all.records[100].weight = 600.0;
    let s = split(&all.records, &j.parts(), &j.seen(), 99.0, None).unwrap();
    assert_eq!(s.slow, 10, "{s:?}");
    assert_eq!(s.parts[0].component, Component::Loss, "{s:?}");
    assert!(s.parts[0].added_us > 200_000, "{s:?}");
    assert_eq!(s.at_us, 50 + FAST + 210_000, "{s:?}");
}
