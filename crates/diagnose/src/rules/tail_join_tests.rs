//! The joined tail on constructed runs: the cause and the mechanism come from what the slow
//! requests' own parts show.

use lagtrace_model::diagnosis::evidence::{RequestJoin, RequestParts};
use lagtrace_model::{Cause, FindingKind, RequestRecord};

use super::*;
use crate::verdict::Mechanism;

/// A closed loop of `conns` keep-alive connections for 2 s; `part(conn, index, t)` gives the
/// parts of a request starting at `t` (delivery and transfer are added).
fn run(
    conns: u64,
    part: &dyn Fn(u64, u32, u64) -> RequestParts,
) -> (Vec<RequestRecord>, RequestJoin) {
    let (mut rs, mut ps) = (Vec::new(), Vec::new());
    let mut seed = 5u64;
    for c in 0..conns {
        let (mut t, mut i) = (c * 41, 0u32);
        while t < 2_000_000 {
            let mut p = part(c, i, t);
            p.stream = Some(c as u32);
            p.delivery_us = 20;
            p.transfer_us = 30;
            let wait = 50 + p.server_us + p.hold_us + p.loss_us + p.connect_us;
            rs.push(RequestRecord {
                conn: c,
                local: None,
                remote: "10.0.0.2:80".parse().unwrap(),
                index: i,
                start_us: t,
                wait_us: wait,
                connect_start_us: 0,
                connect_end_us: Some(0),
                syn_retransmits: Some(0),
                intended_us: None,
                sent_first_us: Some(t),
                sent_last_us: Some(t),
                first_byte_us: Some(t + wait - 30),
                last_byte_us: Some(t + wait),
                bytes: 10,
                status: Some(200),
                error: None,
                pending: false,
                slow: false,
                weight: 1.0,
            });
            ps.push(p);
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            t += wait + 10 + (seed >> 33) % 100;
            i += 1;
        }
    }
    let j = RequestJoin {
        concurrency: conns as u32,
        matched: ps.len() as u64,
        captured_until_us: None,
        requests: ps,
        ..RequestJoin::default()
    };
    (rs, j)
}

fn server(us: u64) -> RequestParts {
    RequestParts {
        server_us: us,
        ..RequestParts::default()
    }
}

#[test]
fn every_nth_server_time_names_slow_server_with_its_mechanism() {
    let (rs, j) = run(4, &|_, i, _| server(if i % 10 == 9 { 40_000 } else { 100 }));
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer);
    assert_eq!(t.parts[0].mechanism, Some(Mechanism::EveryNth));
    assert!(t.parts[0].share > 0.95, "{t:?}");
    assert_eq!(
        t.text(),
        format!(
            "{} server time (+{}), on every 10th request of a connection",
            pct(t.parts[0].share),
            ms(t.parts[0].added_us)
        )
    );
    assert!(t.line().contains("seen in the capture"), "{}", t.line());
}

#[test]
fn a_periodic_pause_names_slow_server_with_its_period() {
    let (rs, j) = run(6, &|_, _, t| {
        let k = t % 250_000;
        server(if (50_000..100_000).contains(&k) {
            100_000 - k + 100
        } else {
            100
        })
    });
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer);
    assert_eq!(t.parts[0].mechanism, Some(Mechanism::PeriodicPause));
    let text = t.text();
    assert!(text.contains("process-wide pauses every 25"), "{text}");
}

#[test]
fn held_responses_name_the_holds_cause_and_no_mechanism() {
    let (rs, j) = run(4, &|c, i, _| {
        if (i + c as u32) % 37 == 5 {
            RequestParts {
                hold_us: 200_000,
                hold_kind: Some(FindingKind::TcpCork),
                ..server(100)
            }
        } else {
            server(100)
        }
    });
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::TcpCork);
    assert_eq!(t.parts[0].mechanism, None);
    assert!(t.mechanism.is_none());
}

#[test]
fn a_tail_outside_every_component_is_unexplained() {
    let (mut rs, j) = run(2, &|_, _, _| server(100));
    for r in rs.iter_mut().step_by(53) {
        r.wait_us += 80_000;
    }
    // The parts no longer add up to those waits: the remainder is what they waited for.
    let mut j = j;
    for (r, p) in rs.iter().zip(j.requests.iter_mut()) {
        let sum = p.connect_us
            + p.delivery_us
            + p.server_us
            + p.hold_us
            + p.loss_us
            + p.transfer_us
            + p.client_read_us;
        p.unexplained_us = r.wait_us as i64 - sum as i64;
    }
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::UnexplainedTail);
}

#[test]
fn without_records_or_with_a_join_of_other_records_there_is_none() {
    let (rs, j) = run(2, &|_, _, _| server(100));
    assert!(joined(None, Some(&j), 99.0).is_none());
    assert!(joined(Some(&rs), None, 99.0).is_none());
    assert!(joined(Some(&rs[1..]), Some(&j), 99.0).is_none());
}

#[test]
fn ordinals() {
    let v: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101].map(ordinal).into();
    assert_eq!(
        v,
        [
            "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"
        ]
    );
}

/// Connects slow by milliseconds (a busy accept on shared CPUs), no SYN retransmitted: the
/// connection-setup part names no cause — it read `syn-drop` on a healthy nginx under CPU
/// load. With two slow connects that waited for a retransmitted SYN it is `syn-drop`; with
/// one among many slow requests it is that request, not the tail (a c=32 run's one 1 s
/// connect among 845 slow requests read "syn-drop +1.25 ms").
#[test]
fn connection_setup_names_syn_drop_only_for_retransmitted_syns() {
    let connect = |us: u64| RequestParts {
        connect_us: us,
        server_us: 100,
        ..RequestParts::default()
    };
    // Every connection's first request waits 3 ms to connect.
    let (rs, j) = run(40, &|_, i, _| {
        if i == 0 { connect(3_000) } else { server(100) }
    });
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert!(t.parts.iter().all(|p| p.cause != Cause::SynDrop), "{t:?}");
    // The same, with a slow server on every 10th request (a slow set of hundreds) and one
    // connect that waited 1 s for its SYN's retransmission.
    let part = |c: u64, i: u32, _| match (c, i) {
        (7, 0) => connect(1_000_000),
        (_, i) if i % 10 == 9 => server(20_000),
        _ => server(100),
    };
    let (mut rs, j) = run(40, &part);
    let mark = |rs: &mut Vec<RequestRecord>, conn: u64| {
        let r = rs
            .iter_mut()
            .find(|r| r.conn == conn && r.index == 0)
            .unwrap();
        r.syn_retransmits = Some(1);
    };
    mark(&mut rs, 7);
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert!(t.split.slow >= 20, "{}", t.split.slow);
    assert!(t.parts.iter().all(|p| p.cause != Cause::SynDrop), "{t:?}");
    // Two such connects: the tail's connects wait for SYN retransmissions.
    let part2 = |c: u64, i: u32, t| match (c, i) {
        (9, 0) => connect(1_000_000),
        _ => part(c, i, t),
    };
    let (mut rs, j) = run(40, &part2);
    mark(&mut rs, 7);
    mark(&mut rs, 9);
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert!(t.parts.iter().any(|p| p.cause == Cause::SynDrop), "{t:?}");
}

/// The capture stopped at 0.4 s of a 2 s run (its packet limit) while the server paused
/// 50 ms every 250 ms: the covered part shows two stalls of server time, too few to call
/// periodic; the load's own records show the same stalls through the run. The requests
/// after the capture are left out of the split (not counted as unexplained) and the pause is
/// named from the records, said so. Without the recurrence in the records, no mechanism.
#[test]
fn a_pause_the_capture_saw_too_few_times_is_read_from_the_records_after_it() {
    const UNTIL: u64 = 400_000;
    let pause = |t: u64| {
        let k = t % 250_000;
        if (50_000..100_000).contains(&k) {
            100_000 - k + 100
        } else {
            100
        }
    };
    let cut = |rs: &[RequestRecord], j: &mut RequestJoin| {
        for (r, p) in rs.iter().zip(j.requests.iter_mut()) {
            if r.start_us > UNTIL {
                // No packets: the whole wait is unexplained.
                *p = RequestParts {
                    unexplained_us: r.wait_us as i64,
                    ..RequestParts::default()
                };
            }
        }
        j.captured_until_us = Some(UNTIL);
    };
    let (rs, mut j) = run(6, &|_, _, t| server(pause(t)));
    cut(&rs, &mut j);
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer, "{}", t.line());
    assert!(t.parts[0].share > 0.9, "{}", t.line());
    assert_eq!(
        t.parts[0].mechanism,
        Some(Mechanism::PeriodicPause),
        "{}",
        t.line()
    );
    assert!(t.pause_from_records && t.after_capture > 0, "{t:?}");
    assert!(
        t.line().contains("read from the load's own records"),
        "{}",
        t.line()
    );
    assert!(
        t.line().contains("started after the capture stopped"),
        "{}",
        t.line()
    );
    // The covered part alone (the records after it fast): server time, no pattern.
    let (rs, mut j) = run(6, &|_, _, t| {
        server(if t <= UNTIL { pause(t) } else { 100 })
    });
    cut(&rs, &mut j);
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer, "{}", t.line());
    assert_eq!(t.parts[0].mechanism, None, "{}", t.line());
    assert!(!t.pause_from_records);
}

/// The capture stopped at 0.4 s; the covered part's slow requests are server time at
/// random, and a periodic stall shows in the records only after the capture: that pattern
/// is not the captured server time's (it could be the client's own), so no mechanism is
/// read from the records. A request that started before the capture's end but ended after
/// it is not covered. And when every slow request came after the capture, the line says the
/// capture saw none of them.
#[test]
fn the_records_name_a_pause_only_when_the_capture_saw_one_of_its_stalls() {
    const UNTIL: u64 = 400_000;
    let cut = |rs: &[RequestRecord], j: &mut RequestJoin| {
        for (r, p) in rs.iter().zip(j.requests.iter_mut()) {
            if r.start_us + r.wait_us > UNTIL {
                *p = RequestParts {
                    unexplained_us: r.wait_us as i64,
                    ..RequestParts::default()
                };
            }
        }
        j.captured_until_us = Some(UNTIL);
    };
    let pause_after = |t: u64| {
        let k = t % 250_000;
        if t > UNTIL + 100_000 && (50_000..100_000).contains(&k) {
            100_000 - k + 100
        } else {
            100
        }
    };
    let random_slow = |c: u64, i: u32| {
        let h = (c.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(i).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_mul(0x94D0_49BB_1331_11EB);
        (h >> 40).is_multiple_of(1999)
    };
    let (rs, mut j) = run(6, &|c, i, t| {
        server(if t <= UNTIL && random_slow(c, i) {
            60_000
        } else {
            pause_after(t)
        })
    });
    cut(&rs, &mut j);
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer, "{}", t.line());
    assert!(t.after_capture > 0, "{t:?}");
    assert!(!t.pause_from_records, "{}", t.line());
    assert_eq!(t.parts[0].mechanism, None, "{}", t.line());
    assert!(!t.complete());
    // Every slow request after the capture (a deep tail's set, from 10 ms): none in the
    // split, most uncaptured.
    let (rs, mut j) = run(6, &|_, _, t| server(pause_after(t)));
    cut(&rs, &mut j);
    let t = joined_from(Some(&rs), Some(&j), 99.9, Some(10_000)).unwrap();
    assert_eq!(t.split.slow, 0, "{}", t.line());
    assert!(t.mostly_uncaptured(), "{t:?}");
    assert!(t.line().contains("it saw none"), "{}", t.line());
    assert!(t.parts.is_empty(), "{}", t.line());
}

/// A capture that stopped with the run (its last packet a hair before the last records'
/// ends, no request started after it) was not cut: every request is covered, the slowest
/// too — a connect still pending at the run's end is no request "after the capture".
#[test]
fn a_capture_that_ends_with_the_run_cuts_nothing() {
    // The slow requests are the last: they end after the capture's last packet.
    let (rs, mut j) = run(6, &|c, _, t| {
        server(if t > 1_900_000 && c < 3 { 80_000 } else { 100 })
    });
    let last_start = rs.iter().map(|r| r.start_us).max().unwrap();
    j.captured_until_us = Some(last_start);
    let t = joined_from(Some(&rs), Some(&j), 99.99, Some(10_000)).unwrap();
    assert_eq!(t.after_capture, 0, "{}", t.line());
    assert!(t.split.slow >= 3, "{}", t.line());
    assert_eq!(t.parts[0].cause, Cause::SlowServer, "{}", t.line());
}

/// The slow requests' server time spent on their upstream exchanges (one hop of two): the
/// tail names that hop; the server's own time stays small.
fn upstream(us: u64, hop: u32, own: u64) -> RequestParts {
    RequestParts {
        server_us: us + own,
        upstream_us: us,
        upstream: Some(lagtrace_model::diagnosis::evidence::UpstreamRef {
            hop,
            local_port: 40_000,
            stream: 0,
            index: 0,
        }),
        ..RequestParts::default()
    }
}

#[test]
fn server_time_spent_on_one_hop_names_that_hop() {
    // Every 10th request waits 40 ms on hop 1; the others 100 µs on hop 0 or 1.
    let (rs, j) = run(4, &|c, i, _| {
        if i % 10 == 9 {
            upstream(40_000, 1, 80)
        } else {
            upstream(100, (c % 2) as u32, 80)
        }
    });
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer);
    let u = t.upstream.expect("the tail's server time is the hop's");
    assert_eq!(u.hop, 1);
    assert!(u.added_us > 35_000 && u.share > 0.9, "{u:?}");
    assert!(
        u.requests >= t.split.slow * 9 / 10,
        "{u:?} {}",
        t.split.slow
    );
    assert!(
        t.line().contains("their wait on the exchanges"),
        "{}",
        t.line()
    );
    // The same stalls in the server's own time: no hop is named.
    let (rs, j) = run(4, &|_, i, _| {
        upstream(100, 0, if i % 10 == 9 { 40_000 } else { 80 })
    });
    let t = joined(Some(&rs), Some(&j), 99.0).unwrap();
    assert_eq!(t.parts[0].cause, Cause::SlowServer);
    assert_eq!(t.upstream, None, "{t:?}");
}
