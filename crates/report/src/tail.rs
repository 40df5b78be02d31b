//! The tail's charts: the per-request timeline of a load run (one mark per kept record:
//! x = when its wait began, y = how long it waited, on a log scale, coloured by connection;
//! a pause of the whole server shows as a vertical stripe of marks of many connections) and
//! the stacked bar of what the tail's excess over the p50 is made of.

use std::fmt::Write as _;

use lagtrace_model::RequestRecords;
use lagtrace_model::diagnosis::verdict::Tail;

use crate::ms;
use crate::svg::esc;

/// Connection colours: twelve distinguishable hues, reused in order of the connection id.
const PALETTE: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f", "#393b79", "#637939",
];

/// The colour of connection `conn`.
pub(crate) fn conn_color(conn: u64) -> &'static str {
    PALETTE[(conn % PALETTE.len() as u64) as usize]
}

/// The timeline of one run's kept records (`label` is `c=1`, `c=32`); `None` without
/// records. Slow records (kept exactly) are filled dots, sampled ones (weighted) hollow,
/// failed or pending ones crosses.
pub fn timeline(label: &str, recs: &RequestRecords) -> Option<String> {
    let r = &recs.records;
    if r.is_empty() {
        return None;
    }
    let (w, h) = (760.0, 260.0);
    let (l, rm, t, b) = (70.0, 20.0, 16.0, 40.0);
    let (pw, ph) = (w - l - rm, h - t - b);
    let xmax = r.iter().map(|x| x.start_us).max().unwrap_or(0).max(1) as f64;
    let lo = r.iter().map(|x| x.wait_us.max(1)).min().unwrap_or(1);
    let hi = r.iter().map(|x| x.wait_us.max(1)).max().unwrap_or(1);
    let ylo = (lo as f64).log10().floor();
    let yhi = ((hi as f64).log10().ceil()).max(ylo + 1.0);
    let x = |us: u64| l + us as f64 / xmax * pw;
    let y = |us: u64| t + ph - ((us.max(1) as f64).log10() - ylo) / (yhi - ylo) * ph;
    let id = label.replace('=', "");
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<svg class="chart timeline" id="timeline-{}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="per-request wait over time, {}"><rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccc"/>"##,
        esc(&id),
        esc(label)
    );
    let mut e = ylo;
    while e <= yhi + 1e-9 {
        let us = 10f64.powf(e) as u64;
        let yy = y(us);
        let _ = write!(
            o,
            r##"<line x1="{l}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e3e3e8"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
            l + pw,
            l - 6.0,
            yy + 4.0,
            esc(&ms(us))
        );
        e += 1.0;
    }
    for i in 0..=4 {
        let us = (xmax * i as f64 / 4.0) as u64;
        let xx = x(us);
        let _ = write!(
            o,
            r##"<text x="{xx:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"##,
            t + ph + 16.0,
            esc(&ms(us))
        );
    }
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle" class="axis">request start since the run's start</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle" class="axis">wait</text>"#,
        l + pw / 2.0,
        h - 6.0,
        t + ph / 2.0,
        t + ph / 2.0
    );
    for rec in r {
        let (cx, cy, c) = (x(rec.start_us), y(rec.wait_us), conn_color(rec.conn));
        let kind = if rec.slow { "slow" } else { "sampled" };
        if rec.error.is_some() || rec.pending {
            let _ = write!(
                o,
                r#"<path class="rec {kind} failed" data-conn="{}" d="M{:.1},{:.1}l6,6m0,-6l-6,6" stroke="{c}" stroke-width="2"/>"#,
                rec.conn,
                cx - 3.0,
                cy - 3.0
            );
        } else {
            let fill = if rec.slow { c } else { "none" };
            let _ = write!(
                o,
                r#"<circle class="rec {kind}" data-conn="{}" cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{fill}" stroke="{c}" stroke-width="1.2"/>"#,
                rec.conn
            );
        }
    }
    o.push_str("</svg>");
    Some(o)
}

/// The caption of a timeline: how the records were kept (every slow one exactly, the rest a
/// weighted sample) and how many requests they stand for.
pub fn timeline_caption(label: &str, recs: &RequestRecords) -> String {
    let slow = recs.records.iter().filter(|r| r.slow).count();
    let sampled = recs.records.len() - slow;
    let conns: std::collections::BTreeSet<u64> = recs.records.iter().map(|r| r.conn).collect();
    format!(
        "{label}: {} marks on {} connections (colour = connection) — slowest {slow} kept exactly + sample of {sampled} (weighted) of {} requests; filled = slow, hollow = sampled, × = failed or still pending (a lower bound); a pause of the whole server is a vertical stripe",
        recs.records.len(),
        conns.len(),
        recs.seen
    )
}

/// The tail's decomposition: a bar of the tail's latency (the p50, then the excess), and
/// under the excess one bar per part with its cause, time and share. The parts overlap
/// (each is measured over the same slow requests, not per request, so their shares do not
/// add): each bar starts at the p50 and shows what that part alone accounts for.
pub fn tail_bar(tail: &Tail, p50_us: u64) -> String {
    let rows = tail.parts.len() as f64;
    let (w, h) = (760.0, 70.0 + 26.0 * rows.max(1.0));
    // Left: the part's name; right: room for its time and share after the longest bar.
    let (l, lw, rm) = (10.0, 150.0, 190.0);
    let pw = w - l - lw - rm;
    let x0 = l + lw;
    let scale = tail
        .latency_us
        .max(p50_us + tail.parts.iter().map(|p| p.added_us).max().unwrap_or(0))
        .max(1) as f64;
    let sx = |us: u64| us as f64 / scale * pw;
    let mut o = String::new();
    let _ = write!(
        o,
        r##"<svg class="chart" id="tail-decomposition" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="what the tail is made of"><text x="{l}" y="16" class="axis">p{} {} = p50 {} + excess {}</text>"##,
        tail.percentile,
        esc(&ms(tail.latency_us)),
        esc(&ms(p50_us)),
        esc(&ms(tail.excess_us))
    );
    let (pwid, ewid) = (sx(p50_us), sx(tail.excess_us));
    let _ = write!(
        o,
        r##"<text x="{l}" y="42" class="legend">p{}</text><rect class="part" data-part="p50" x="{x0}" y="28" width="{pwid:.1}" height="20" fill="#bdc3c7"/><rect class="part" data-part="excess" x="{:.1}" y="28" width="{ewid:.1}" height="20" fill="#f5b7b1"/>"##,
        tail.percentile,
        x0 + pwid
    );
    for (i, p) in tail.parts.iter().enumerate() {
        let mech = p
            .mechanism
            .and_then(|m| serde_json::to_value(m).ok())
            .and_then(|v| v.as_str().map(|s| format!(" ({s})")))
            .unwrap_or_default();
        let name = format!("{}{mech}", p.cause.code());
        let y = 56.0 + 26.0 * i as f64;
        let aw = sx(p.added_us);
        let _ = write!(
            o,
            r##"<text x="{l}" y="{:.1}" class="legend">{}</text><rect class="part" data-part="{}" x="{:.1}" y="{y:.1}" width="{aw:.1}" height="18" fill="{}"/><text x="{:.1}" y="{:.1}" class="legend">+{} ({:.0} % of the excess)</text>"##,
            y + 13.0,
            esc(&name),
            esc(&name),
            x0 + pwid,
            PALETTE[(i + 1) % PALETTE.len()],
            x0 + pwid + aw + 4.0,
            y + 13.0,
            esc(&ms(p.added_us)),
            p.share * 100.0
        );
    }
    if tail.parts.is_empty() {
        let _ = write!(
            o,
            r#"<text x="{x0}" y="{}" class="legend">no layer explains the excess</text>"#,
            69.0
        );
    }
    o.push_str("</svg>");
    o
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use lagtrace_model::diagnosis::verdict::{Mechanism, TailPart};
    use lagtrace_model::{Cause, RequestRecord};

    use super::*;

    /// A closed-loop run of `conns` connections, each request 1 ms (plus a per-connection
    /// offset so the connections do not move in step), for `secs` seconds; with `pause`,
    /// the whole server stops for 100 ms every second and every request in flight waits
    /// for the pause's end.
    fn run(conns: u64, secs: u64, pause: bool) -> RequestRecords {
        let mut records = Vec::new();
        for c in 0..conns {
            let mut t = c * 137;
            let mut index = 0;
            while t < secs * 1_000_000 {
                let service = 1_000 + c * 50;
                let mut end = t + service;
                let p = (t / 1_000_000) * 1_000_000 + 500_000;
                if pause && end > p && t < p + 100_000 {
                    end = end.max(p + 100_000 + service);
                }
                records.push(RequestRecord {
                    conn: c,
                    local: None,
                    remote: "127.0.0.1:80".parse().unwrap(),
                    index,
                    start_us: t,
                    wait_us: end - t,
                    connect_start_us: 0,
                    connect_end_us: Some(100),
                    syn_retransmits: Some(0),
                    intended_us: None,
                    sent_first_us: Some(t),
                    sent_last_us: Some(t),
                    first_byte_us: Some(end),
                    last_byte_us: Some(end),
                    bytes: 100,
                    status: Some(200),
                    error: None,
                    pending: false,
                    slow: end - t > 10_000,
                    weight: 1.0,
                });
                t = end;
                index += 1;
            }
        }
        records.sort_by_key(|r| (r.start_us, r.conn));
        // Keep every slow record and every 40th other one, as the load's sample would.
        let kept: Vec<RequestRecord> = records
            .iter()
            .enumerate()
            .filter(|(i, r)| r.slow || i % 40 == 0)
            .map(|(_, r)| r.clone())
            .collect();
        RequestRecords {
            start_unix_us: 0,
            threads: 1,
            slow_cap: 4096,
            sample_cap: 50,
            seen: records.len() as u64,
            pending: 0,
            records: kept,
        }
    }

    /// The marks of a timeline: (connection, x, y, colour, slow).
    fn marks(svg: &str) -> Vec<(u64, f64, f64, String, bool)> {
        let attr = |m: &str, k: &str| -> String {
            let i = m.find(&format!(" {k}=\"")).unwrap() + k.len() + 3;
            m[i..i + m[i..].find('"').unwrap()].to_owned()
        };
        svg.split("<circle ")
            .skip(1)
            .map(|m| {
                let m = &format!(" {}", &m[..m.find("/>").unwrap()]);
                (
                    attr(m, "data-conn").parse().unwrap(),
                    attr(m, "cx").parse().unwrap(),
                    attr(m, "cy").parse().unwrap(),
                    attr(m, "stroke"),
                    attr(m, "class").contains("slow"),
                )
            })
            .collect()
    }

    /// The widest set of connections whose slow marks fall within `dx` pixels of each other.
    fn widest_stripe(m: &[(u64, f64, f64, String, bool)], dx: f64) -> usize {
        let slow: Vec<_> = m.iter().filter(|k| k.4).collect();
        slow.iter()
            .map(|a| {
                slow.iter()
                    .filter(|b| (b.1 - a.1).abs() <= dx)
                    .map(|b| b.0)
                    .collect::<BTreeSet<u64>>()
                    .len()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn one_mark_per_record_coloured_by_connection() {
        let recs = run(8, 3, true);
        let svg = timeline("c=8", &recs).unwrap();
        let m = marks(&svg);
        assert_eq!(m.len(), recs.records.len());
        assert_eq!(svg.matches("class=\"rec ").count(), recs.records.len());
        let mut colour: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for k in &m {
            assert_eq!(k.3, conn_color(k.0));
            colour.entry(k.0).or_default().insert(k.3.clone());
        }
        assert_eq!(colour.len(), 8, "every connection has marks");
        assert!(
            colour.values().all(|c| c.len() == 1),
            "one colour per connection"
        );
        let distinct: BTreeSet<_> = colour.values().flatten().collect();
        assert_eq!(distinct.len(), 8, "8 connections, 8 colours");
        // Slower is higher: the y of a mark falls as its wait grows.
        let slow_y = m
            .iter()
            .filter(|k| k.4)
            .map(|k| k.2)
            .fold(f64::MIN, f64::max);
        let fast_y = m
            .iter()
            .filter(|k| !k.4)
            .map(|k| k.2)
            .fold(f64::MAX, f64::min);
        assert!(
            slow_y < fast_y,
            "slow marks above fast ones: {slow_y} {fast_y}"
        );
        let cap = timeline_caption("c=8", &recs);
        let slow = recs.records.iter().filter(|r| r.slow).count();
        assert!(
            cap.contains(&format!("slowest {slow} kept exactly + sample of")),
            "{cap}"
        );
    }

    #[test]
    fn a_pause_of_the_whole_server_is_a_vertical_stripe() {
        // 3 s over 690 px: the 100 ms pause is 23 px wide.
        let svg = timeline("c=8", &run(8, 3, true)).unwrap();
        let m = marks(&svg);
        assert_eq!(
            widest_stripe(&m, 25.0),
            8,
            "all 8 connections in one stripe"
        );
        let stripes: BTreeSet<i64> = m
            .iter()
            .filter(|k| k.4)
            .map(|k| (k.1 / 100.0) as i64)
            .collect();
        assert!(stripes.len() >= 3, "one stripe per pause: {stripes:?}");
        // The control: one connection slowed alone at times of its own makes no stripe.
        let mut recs = run(8, 3, false);
        for (n, r) in recs.records.iter_mut().filter(|r| r.conn == 3).enumerate() {
            if n % 10 == 0 {
                r.wait_us += 80_000;
                r.slow = true;
            }
        }
        let m = marks(&timeline("c=8", &recs).unwrap());
        assert!(m.iter().any(|k| k.4));
        assert_eq!(widest_stripe(&m, 25.0), 1);
    }

    #[test]
    fn tail_parts_are_labelled_bars_from_the_p50() {
        let tail = Tail {
            percentile: 99.0,
            latency_us: 46_000,
            excess_us: 45_000,
            parts: vec![
                TailPart {
                    cause: Cause::SynDrop,
                    mechanism: Some(Mechanism::AcceptQueueOverflow),
                    added_us: 40_000,
                    share: 40.0 / 45.0,
                },
                TailPart {
                    cause: Cause::PacketLoss,
                    mechanism: None,
                    added_us: 9_000,
                    share: 0.2,
                },
            ],
            text: "x".into(),
        };
        let svg = tail_bar(&tail, 1_000);
        assert_eq!(
            svg.matches("class=\"part\"").count(),
            4,
            "p50, excess, 2 parts"
        );
        assert!(svg.contains("syn-drop (accept-queue-overflow)"));
        assert!(svg.contains("89 % of the excess"));
        assert!(svg.contains("packet-loss"));
        let width = |part: &str| -> f64 {
            let i = svg.find(&format!("data-part=\"{part}\"")).unwrap();
            let w = &svg[i..];
            let j = w.find("width=\"").unwrap() + 7;
            w[j..j + w[j..].find('"').unwrap()].parse().unwrap()
        };
        assert!(
            (width("syn-drop (accept-queue-overflow)") / width("excess") - 40.0 / 45.0).abs()
                < 0.01
        );
        assert!(svg.contains("no layer explains") == tail.parts.is_empty());
    }
}
