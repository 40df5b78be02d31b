//! Inline SVG: the latency percentile chart (log-scaled percentile axis, as HdrHistogram's
//! plots); the flow ladder of one connection is in `ladder`.

use std::fmt::Write as _;

use lagtrace_model::diagnosis::evidence::{AppRun, PercentilePoint};

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

/// The vertices of a distribution drawn as the step function it is: between two measured
/// percentiles p₀ < p₁ the requests took between v₀ and v₁, and v₁ is the level the band
/// reached, so the line rises at p₀ and runs flat to p₁ (the value at each percentile is
/// never understated, and no latency between the measured ones is invented by a ramp).
fn steps(points: &[PercentilePoint]) -> Vec<(f64, u64)> {
    let mut v = Vec::with_capacity(points.len() * 2);
    for (i, p) in points.iter().enumerate() {
        if i > 0 {
            v.push((points[i - 1].percentile, p.latency_us));
        }
        v.push((p.percentile, p.latency_us));
    }
    v
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

    /// One step line per series, and its legend entry.
    fn series(&self, o: &mut String, series: &[Series]) {
        let Plot { l, t, pw, .. } = *self;
        let x = |p| self.x(p);
        let y = |us| self.y(us);
        for (i, s) in series.iter().enumerate() {
            let pts: Vec<String> = steps(&s.points)
                .into_iter()
                .map(|(p, us)| format!("{:.1},{:.1}", x(p), y(us)))
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
    fn a_distribution_is_drawn_as_steps_rising_at_the_lower_percentile() {
        let pt = |percentile, latency_us| PercentilePoint {
            percentile,
            latency_us,
        };
        let s = steps(&[pt(0.0, 100), pt(90.0, 200), pt(99.0, 40_000)]);
        assert_eq!(
            s,
            vec![
                (0.0, 100),
                (0.0, 200),
                (90.0, 200),
                (90.0, 40_000),
                (99.0, 40_000)
            ]
        );
        // Every segment is horizontal or vertical: no ramp.
        for w in s.windows(2) {
            assert!(w[0].0 == w[1].0 || w[0].1 == w[1].1, "{w:?}");
        }
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
