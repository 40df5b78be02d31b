//! Inline SVG charts: the latency percentile chart (log-scaled percentile axis, as
//! HdrHistogram's plots) and the flow ladder of one connection.

use std::fmt::Write as _;

use lagtrace_model::diagnosis::evidence::{AppRun, Direction, Flow, PercentilePoint};

use crate::ms;

/// Escapes text for HTML/SVG.
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

/// One line of the percentile chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label (`c=1`, `c=32 before`).
    pub label: String,
    /// CSS colour.
    pub color: String,
    /// Dashed (for "before" series).
    pub dashed: bool,
    /// Points, percentile ascending.
    pub points: Vec<PercentilePoint>,
}

impl Series {
    /// The series of one load run: its distribution, or its summary percentiles.
    pub fn of_run(label: String, color: &str, dashed: bool, r: &AppRun) -> Series {
        let points = if r.distribution.len() >= 2 {
            r.distribution.clone()
        } else {
            let l = &r.latency;
            [
                (0.0, l.min_us),
                (50.0, l.p50_us),
                (90.0, l.p90_us),
                (99.0, l.p99_us),
                (99.9, l.p999_us),
                (100.0, l.max_us),
            ]
            .into_iter()
            .map(|(p, v)| PercentilePoint {
                percentile: p,
                latency_us: v,
            })
            .collect()
        };
        Series {
            label,
            color: color.into(),
            dashed,
            points,
        }
    }
}

/// Largest "nines" shown: 99.999%.
const MAX_X: f64 = 5.0;

fn px(p: f64) -> f64 {
    // HdrHistogram's plot axis: 1/(1-p) on a log scale, i.e. -log10(1-p).
    let q = (1.0 - p / 100.0).max(10f64.powf(-MAX_X));
    (-q.log10()).clamp(0.0, MAX_X)
}

/// The percentile chart: x = percentile on HdrHistogram's log axis (0%, 90%, 99%, 99.9%...),
/// y = latency on a log scale (so 40 ms and 0.1 ms series read side by side).
pub fn percentile_chart(series: &[Series]) -> String {
    let (w, h) = (760.0, 340.0);
    let g = Plot::new(series, w, h);
    let Plot { l, t, pw, ph, .. } = g;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="chart" id="percentile-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="latency by percentile">"#
    );
    let _ = write!(
        o,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccc"/>"##
    );
    g.y_grid(&mut o);
    g.x_grid(&mut o);
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle" class="axis">percentile</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle" class="axis">latency</text>"#,
        l + pw / 2.0,
        h - 6.0,
        t + ph / 2.0,
        t + ph / 2.0
    );
    g.series(&mut o, series);
    o.push_str("</svg>");
    o
}

/// The percentile chart's plot area and axes: the margins, and the ranges in decades of
/// latency (y) and "nines" of percentile (x).
#[derive(Clone, Copy)]
struct Plot {
    l: f64,
    t: f64,
    pw: f64,
    ph: f64,
    ylo: f64,
    yhi: f64,
    xmax: f64,
}

impl Plot {
    fn new(series: &[Series], w: f64, h: f64) -> Plot {
        let (l, r, t, b) = (70.0, 150.0, 20.0, 40.0);
        let mut lo = u64::MAX;
        let mut hi = 1;
        for s in series {
            for p in &s.points {
                lo = lo.min(p.latency_us.max(1));
                hi = hi.max(p.latency_us.max(1));
            }
        }
        if lo == u64::MAX {
            lo = 1;
        }
        let ylo = (lo as f64).log10().floor();
        let mut yhi = (hi as f64).log10().ceil();
        if yhi <= ylo {
            yhi = ylo + 1.0;
        }
        let xmax = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| px(p.percentile)))
            .fold(3.0_f64, f64::max)
            .ceil();
        Plot {
            l,
            t,
            pw: w - l - r,
            ph: h - t - b,
            ylo,
            yhi,
            xmax,
        }
    }

    fn x(&self, p: f64) -> f64 {
        self.l + px(p) / self.xmax * self.pw
    }

    fn y(&self, us: u64) -> f64 {
        self.t + self.ph
            - (((us.max(1)) as f64).log10() - self.ylo) / (self.yhi - self.ylo) * self.ph
    }

    /// Y grid: decades (and 2×, 5× within a range of two decades or less).
    fn y_grid(&self, o: &mut String) {
        let Plot {
            l, pw, ylo, yhi, ..
        } = *self;
        let y = |us| self.y(us);
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
            if yhi - ylo <= 2.0 {
                for m in [2.0, 5.0] {
                    let us = (10f64.powf(e) * m) as u64;
                    if (us as f64).log10() < yhi {
                        let yy = y(us);
                        let _ = write!(
                            o,
                            r##"<line x1="{l}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#f0f0f3"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
                            l + pw,
                            l - 6.0,
                            yy + 4.0,
                            esc(&ms(us))
                        );
                    }
                }
            }
            e += 1.0;
        }
    }

    /// X grid: 0%, 90%, 99%, 99.9%, ...
    fn x_grid(&self, o: &mut String) {
        let Plot {
            l, t, pw, ph, xmax, ..
        } = *self;
        let labels = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"];
        for (i, lab) in labels.iter().enumerate().take(xmax as usize + 1) {
            let xx = l + i as f64 / xmax * pw;
            let _ = write!(
                o,
                r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{t}" y2="{}" stroke="#e3e3e8"/><text x="{xx:.1}" y="{}" text-anchor="middle" class="tick">{lab}</text>"##,
                t + ph,
                t + ph + 16.0
            );
        }
    }

    /// One polyline per series, and its legend entry.
    fn series(&self, o: &mut String, series: &[Series]) {
        let Plot { l, t, pw, .. } = *self;
        let x = |p| self.x(p);
        let y = |us| self.y(us);
        for (i, s) in series.iter().enumerate() {
            let pts: Vec<String> = s
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.percentile), y(p.latency_us)))
                .collect();
            let _ = write!(
                o,
                r#"<polyline class="series" fill="none" stroke="{}" stroke-width="2.5"{} points="{}"/>"#,
                esc(&s.color),
                if s.dashed {
                    r#" stroke-dasharray="6 4""#
                } else {
                    ""
                },
                pts.join(" ")
            );
            let ly = t + 14.0 + i as f64 * 20.0;
            let lx = l + pw + 14.0;
            let _ = write!(
                o,
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="3"{}/><text x="{}" y="{}" class="legend">{}</text>"#,
                lx + 22.0,
                esc(&s.color),
                if s.dashed {
                    r#" stroke-dasharray="6 4""#
                } else {
                    ""
                },
                lx + 28.0,
                ly + 4.0,
                esc(&s.label)
            );
        }
    }
}

/// The flow graph of one connection as a ladder: client and server lines, one arrow per
/// packet with its time, flags and length; stalls highlighted and labelled.
pub fn flow_ladder(f: &Flow) -> String {
    let w = 760.0;
    let (cx, sx) = (190.0, 590.0);
    let row: f64 = 30.0;
    let stall_extra: f64 = 46.0;
    let top: f64 = 50.0;
    // Row positions: a stall adds room above the packet that ends it.
    let mut ys = Vec::with_capacity(f.packets.len());
    let mut yy = top;
    for p in &f.packets {
        if f.stalls.iter().any(|s| s.to_frame == p.frame) {
            yy += stall_extra;
        }
        ys.push(yy);
        yy += row;
    }
    let h = yy + 20.0;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg class="chart" id="flow-ladder" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="flow graph of stream {}">"#,
        f.stream
    );
    let _ = write!(
        o,
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker><marker id="arrow-hot" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#c0392b"/></marker></defs>"##
    );
    // Stall bands.
    for s in &f.stalls {
        let a = f.packets.iter().position(|p| p.frame == s.from_frame);
        let b = f.packets.iter().position(|p| p.frame == s.to_frame);
        if let (Some(a), Some(b)) = (a, b) {
            let (y0, y1) = (ys[a] + 6.0, ys[b] - 6.0);
            let _ = write!(
                o,
                r##"<rect class="stall" x="{}" y="{y0:.1}" width="{}" height="{:.1}" fill="#fdecea" stroke="#c0392b" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" text-anchor="middle" class="stall-label">{} stall: {}</text>"##,
                cx - 10.0,
                sx - cx + 20.0,
                (y1 - y0).max(8.0),
                (cx + sx) / 2.0,
                ys[b] - stall_extra / 2.0 + 2.0,
                esc(&ms(s.gap_us)),
                esc(&s.label)
            );
        }
    }
    // Lifelines.
    let _ = write!(
        o,
        r##"<text x="{cx}" y="20" text-anchor="middle" class="host">client {}</text><text x="{sx}" y="20" text-anchor="middle" class="host">server {}</text><line x1="{cx}" x2="{cx}" y1="30" y2="{}" stroke="#333" stroke-width="2"/><line x1="{sx}" x2="{sx}" y1="30" y2="{}" stroke="#333" stroke-width="2"/>"##,
        esc(&f.client),
        esc(&f.server),
        h - 10.0,
        h - 10.0
    );
    let hot: Vec<u64> = f.stalls.iter().map(|s| s.to_frame).collect();
    for (p, &y0) in f.packets.iter().zip(&ys) {
        let (x1, x2) = match p.dir {
            Direction::ToServer => (cx, sx),
            Direction::ToClient => (sx, cx),
        };
        let is_hot = hot.contains(&p.frame);
        let (stroke, marker) = if is_hot {
            ("#c0392b", "arrow-hot")
        } else {
            ("#444", "arrow")
        };
        let _ = write!(
            o,
            r#"<line class="pkt" x1="{x1}" y1="{y0:.1}" x2="{x2}" y2="{:.1}" stroke="{stroke}" stroke-width="{}" marker-end="url(#{marker})"/>"#,
            y0 + 12.0,
            if is_hot { 2.5 } else { 1.5 }
        );
        let label = if p.note.is_empty() {
            format!("{} len {}", p.flags, p.len)
        } else {
            format!("{} len {} · {}", p.flags, p.len, p.note)
        };
        let _ = write!(
            o,
            r#"<text x="{}" y="{:.1}" text-anchor="middle" class="pkt-label{}">{}</text><text x="{}" y="{:.1}" text-anchor="end" class="time">{:.6} s  #{}</text>"#,
            (cx + sx) / 2.0,
            y0 + 2.0,
            if is_hot { " hot" } else { "" },
            esc(&label),
            cx - 16.0,
            y0 + 10.0,
            p.t_us as f64 / 1e6,
            p.frame
        );
    }
    o.push_str("</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_axis_is_log_nines() {
        assert!((px(0.0) - 0.0).abs() < 1e-9);
        assert!((px(90.0) - 1.0).abs() < 1e-9);
        assert!((px(99.0) - 2.0).abs() < 1e-9);
        assert!((px(99.9) - 3.0).abs() < 1e-6);
        assert!((px(100.0) - MAX_X).abs() < 1e-9);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
