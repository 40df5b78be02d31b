//! The slowest requests of a load run, each with where its wait went (its join with the
//! packets: connect, server, hold, loss, transfer, the client's read, and what no
//! timestamp explains) — the rows a reader checks the tail's decomposition against, with
//! the connection and capture stream to find each one in the pcap.

use std::fmt::Write as _;

use lagtrace_model::RequestRecords;
use lagtrace_model::diagnosis::evidence::{PassiveRun, RequestJoin, RequestParts};

use crate::ms;
use crate::svg::esc;

/// Rows shown per run.
pub const ROWS: usize = 10;

/// A part of a wait: blank when zero, so the parts that mattered stand out.
fn part(us: u64) -> String {
    if us == 0 { String::new() } else { ms(us) }
}

/// The table of the `ROWS` slowest of `recs` (a run labelled `label`, e.g. `c=32`) with
/// their parts from `join`; `None` when the join does not follow the records one for one.
/// `unmatched` says why a request without a stream has none (the capture's limit, its drops).
pub fn slowest_table(
    label: &str,
    recs: &RequestRecords,
    join: &RequestJoin,
    unmatched: &str,
) -> Option<String> {
    let r = &recs.records;
    if r.is_empty() || join.requests.len() != r.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..r.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(r[i].wait_us));
    order.truncate(ROWS);
    let mut o = String::new();
    let _ = write!(
        o,
        "<table class=\"slowest\" id=\"slowest-{}\"><tr><th>wait</th><th title=\"client port, request on the connection\">connection</th><th>stream</th><th>connect</th><th>server</th><th>hold</th><th>loss</th><th>transfer</th><th>client read</th><th>unexplained</th><th>outcome</th></tr>",
        esc(&label.replace('=', ""))
    );
    for i in order {
        let (rec, p) = (&r[i], &join.requests[i]);
        // Not matched: no timestamp split its wait, so no part (and no "unexplained") is shown.
        let blank = RequestParts::default();
        let (p, stream) = match p.stream {
            Some(s) => (p, s.to_string()),
            None => (&blank, format!("not matched: {unmatched}")),
        };
        // The client port names the connection in the capture (`tcp.port == N`).
        let conn = rec.local.map_or_else(
            || format!("conn {}", rec.conn),
            |a| format!(":{}", a.port()),
        );
        let outcome = match (&rec.error, rec.status, rec.pending) {
            (_, _, true) => "pending (≥)".to_string(),
            (Some(e), _, _) => e.to_string(),
            (None, Some(s), _) => s.to_string(),
            (None, None, _) => String::new(),
        };
        let _ = write!(
            o,
            "<tr class=\"req\"><td class=\"wait\">{}</td><td>{} #{}</td><td>{}</td><td>{}</td><td class=\"server\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&ms(rec.wait_us)),
            esc(&conn),
            rec.index + 1,
            esc(&stream),
            esc(&connect(p)),
            esc(&part(p.server_us)),
            esc(&hold(p)),
            esc(&part(p.loss_us)),
            esc(&part(p.transfer_us)),
            esc(&part(p.client_read_us)),
            esc(&unexplained(p)),
            esc(&outcome)
        );
    }
    o.push_str("</table>");
    Some(o)
}

fn connect(p: &RequestParts) -> String {
    match p.syn_retransmits.filter(|&n| n > 0) {
        Some(n) => format!("{} ({n} SYN resent)", ms(p.connect_us)),
        None => part(p.connect_us),
    }
}

fn hold(p: &RequestParts) -> String {
    match (p.hold_us, p.hold_kind) {
        (0, _) => String::new(),
        (us, Some(k)) => format!("{} ({k})", ms(us)),
        (us, None) => ms(us),
    }
}

fn unexplained(p: &RequestParts) -> String {
    match p.unexplained_us {
        0 => String::new(),
        u if u < 0 => format!("−{}", ms(u.unsigned_abs())),
        u => ms(u as u64),
    }
}

/// Why requests of a run with packets have no stream: the capture stopped at its limit, lost
/// packets, or neither (their times matched no transaction).
pub fn unmatched_reason(p: &lagtrace_model::diagnosis::evidence::PacketEvidence) -> String {
    use lagtrace_model::diagnosis::evidence::{ACTIVE_CAPTURE_PACKETS, RUN_CAPTURE_PACKETS};
    // A capture stopped by its count holds exactly that many packets: an agent's, which
    // sends its capture whole, or a local run's at its disk bound.
    if let Some(limit) = [ACTIVE_CAPTURE_PACKETS, RUN_CAPTURE_PACKETS]
        .into_iter()
        .find(|&n| p.packets == n)
    {
        format!("after the capture stopped at its {limit} packet limit, so no packets")
    } else if p.dropped > 0 {
        format!(
            "the capture lost {} packets, so these may have none",
            p.dropped
        )
    } else {
        "no captured transaction matched its times".into()
    }
}

/// The caption over a run's table: how many records it was chosen from and how the
/// request clock was put on the capture's.
pub fn slowest_caption(
    label: &str,
    recs: &RequestRecords,
    join: &RequestJoin,
    unmatched: &str,
) -> String {
    let shown = recs.records.len().min(ROWS);
    let clock = match join.offset_us {
        Some(_) if join.offset_consistent => {
            format!("clocks joined within ±{}", ms(join.offset_uncertainty_us))
        }
        Some(_) => format!(
            "clocks joined within ±{} (the matches did not all agree)",
            ms(join.offset_uncertainty_us)
        ),
        None => "no request matched a transaction".into(),
    };
    let rest = if join.matched < recs.records.len() as u64 {
        format!(" (the others: {unmatched})")
    } else {
        String::new()
    };
    format!(
        "{label}: the {shown} slowest of {} kept requests, {} matched to their packets{rest}, \
         {clock}",
        recs.records.len(),
        join.matched
    )
}

/// The real clients' traffic of a passive run: where it was seen, and each client's waits.
pub fn passive_table(p: &PassiveRun) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<table id=\"passive\"><tr><th>capture</th><td>{}</td></tr><tr><th>server</th><td>{}</td></tr><tr><th>clients</th><td>{} addresses, {} connections ({} already open when the capture began)</td></tr><tr><th>incomplete</th><td>{} requests without a complete response in the window (not in the figures)</td></tr></table>",
        esc(&p.source),
        esc(&p.server),
        p.clients,
        p.connections,
        p.joined_open,
        p.incomplete
    );
    if !p.by_client.is_empty() {
        o.push_str("<table id=\"by-client\"><tr><th>client</th><th>requests</th><th>p50</th><th>p99</th></tr>");
        for c in &p.by_client {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.addr),
                c.requests,
                esc(&ms(c.p50_us)),
                esc(&ms(c.p99_us))
            );
        }
        o.push_str("</table>");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use lagtrace_model::diagnosis::evidence::ClientWaits;
    use lagtrace_model::{FindingKind, RequestError, RequestRecord};

    fn rec(conn: u64, wait_us: u64) -> RequestRecord {
        RequestRecord {
            conn,
            local: Some(format!("10.0.0.1:{}", 40_000 + conn).parse().unwrap()),
            remote: "10.0.0.2:80".parse().unwrap(),
            index: 2,
            start_us: conn * 1_000,
            wait_us,
            connect_start_us: 0,
            connect_end_us: Some(100),
            syn_retransmits: Some(0),
            intended_us: None,
            sent_first_us: Some(0),
            sent_last_us: Some(0),
            first_byte_us: Some(wait_us),
            last_byte_us: Some(wait_us),
            bytes: 100,
            status: Some(200),
            error: None,
            pending: false,
            slow: wait_us > 10_000,
            weight: 1.0,
        }
    }

    fn rows(t: &str) -> Vec<&str> {
        t.split("<tr class=\"req\">").skip(1).collect()
    }

    #[test]
    fn the_slowest_come_first_with_their_parts_and_at_most_ten() {
        let waits = [
            900, 41_000, 700, 3_000_000, 800, 600, 500, 400, 300, 200, 100, 50,
        ];
        let records: Vec<_> = waits
            .iter()
            .enumerate()
            .map(|(i, &w)| rec(i as u64, w))
            .collect();
        let mut requests = vec![RequestParts::default(); records.len()];
        requests[1] = RequestParts {
            stream: Some(7),
            server_us: 300,
            hold_us: 40_500,
            hold_kind: Some(FindingKind::NagleDelayedAck),
            ..RequestParts::default()
        };
        requests[3] = RequestParts {
            stream: Some(9),
            connect_us: 3_000_000,
            syn_retransmits: Some(2),
            unexplained_us: -20,
            ..RequestParts::default()
        };
        let mut recs = RequestRecords {
            records,
            ..RequestRecords::default()
        };
        recs.records[3].error = Some(RequestError::ConnectTimeout);
        recs.records[3].status = None;
        let join = RequestJoin {
            concurrency: 32,
            offset_us: Some(5),
            offset_uncertainty_us: 40,
            offset_consistent: true,
            matched: 2,
            captured_until_us: None,
            requests,
        };
        let why = "after the capture stopped at its 200000 packet limit, so no packets";
        let mut unmatched = join.clone();
        unmatched.requests[2].unexplained_us = 700;
        let t = slowest_table("c=32", &recs, &unmatched, why).unwrap();
        assert!(t.contains("id=\"slowest-c32\""));
        let r = rows(&t);
        assert_eq!(r.len(), ROWS);
        assert!(r[0].contains(":40003 #3"), "{}", r[0]);
        assert!(r[0].contains("(2 SYN resent)") && r[0].contains("connect-timeout"));
        assert!(
            r[0].contains("−20µs") || r[0].contains("−20 µs"),
            "{}",
            r[0]
        );
        assert!(r[1].contains("(nagle-delayed-ack)") && r[1].contains("<td>7</td>"));
        // Not matched: the reason, and no part (its "unexplained" would be its whole wait).
        assert!(r[2].contains(&format!("not matched: {why}")), "{}", r[2]);
        assert!(!r[2].contains("<td>700µs</td>"), "{}", r[2]);
        // The two fastest are left out.
        assert!(!t.contains("40011") && !t.contains("40010"));
        let cap = slowest_caption("c=32", &recs, &join, why);
        assert!(
            cap.contains("10 slowest of 12")
                && cap.contains("2 matched to their packets (the others: after"),
            "{cap}"
        );
        // A join that does not follow the records is not drawn.
        let short = RequestJoin {
            requests: vec![RequestParts::default()],
            ..join
        };
        assert!(slowest_table("c=32", &recs, &short, why).is_none());
    }

    #[test]
    fn a_passive_run_names_its_capture_and_its_clients() {
        let p = PassiveRun {
            source: "veth0 in namespace lab-x".into(),
            server: "10.0.0.2:80".into(),
            clients: 2,
            connections: 9,
            incomplete: 1,
            joined_open: 3,
            by_client: vec![ClientWaits {
                addr: "10.0.0.1".into(),
                requests: 120,
                p50_us: 300,
                p99_us: 45_000,
            }],
        };
        let t = passive_table(&p);
        assert!(t.contains("veth0 in namespace lab-x") && t.contains("9 connections (3 already"));
        assert!(t.contains("id=\"by-client\"") && t.contains("<td>10.0.0.1</td><td>120</td>"));
    }
}
