//! The self-contained HTML report: one file, inline CSS and SVG, no scripts, no external
//! assets; readable offline and printable.

use std::fmt::Write as _;

use lagtrace_model::Cause;
use lagtrace_model::diagnosis::Diagnosis;
use lagtrace_model::diagnosis::evidence::{LayerName, LayerStatus};
use lagtrace_model::diagnosis::verdict::{FixSide, Stance};

use crate::flame::flame_graph;
use crate::ladder::flow_ladder;
use crate::slowest::{passive_table, slowest_caption, slowest_table};
use crate::svg::{Series, esc, percentile_chart};
use crate::tail::{tail_bar, timeline, timeline_caption};
use crate::text::layer_summary;

const CSS: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;background:#f4f5f8;color:#1d1f24}
main{max-width:1000px;margin:0 auto;padding:24px}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:16px;margin:28px 0 10px;border-bottom:1px solid #d9dbe2;padding-bottom:4px}
.sub{color:#666;font-size:13px}
.verdict{border-radius:10px;padding:18px 22px;margin:16px 0;color:#fff}
.verdict.bad{background:#b03a2e}.verdict.ok{background:#1e8449}.verdict.down{background:#6c3483}
.verdict .cause{font-size:28px;font-weight:700;font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.verdict .conf{font-size:13px;opacity:.9;margin-left:10px}
.chain .node,.chain mark{padding:2px 6px;border-radius:4px;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px}
.chain .node{background:rgba(255,255,255,.25)}
.chain mark{background:#fff;color:#a00;font-weight:700}
.verdict p{margin:6px 0 0;font-size:15px}
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}
th,td{border:1px solid #e0e2e8;padding:6px 9px;text-align:left;vertical-align:top}
th{background:#eceef3}
.st{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-weight:600}
.st.ok{color:#1e8449}.st.finding{color:#b03a2e}.st.skipped,.st.unavailable{color:#7f8c8d}.st.error{color:#8e44ad}
ul.ev{list-style:none;padding:0;margin:0;background:#fff;border:1px solid #e0e2e8}
ul.ev li{padding:6px 10px;border-bottom:1px solid #eef0f4;font-size:14px}
ul.ev li .tag{display:inline-block;min-width:64px;font-family:ui-monospace,monospace;color:#555}
ul.ev li.supports::before{content:"+ ";color:#b03a2e;font-weight:700}
ul.ev li.rules-out::before{content:"− ";color:#1e8449;font-weight:700}
ul.ev li.note::before{content:"· ";color:#888;font-weight:700}
code{font-family:ui-monospace,"DejaVu Sans Mono",monospace;background:#eef0f4;padding:1px 4px;border-radius:3px}
.chart{background:#fff;border:1px solid #e0e2e8;max-width:100%;height:auto}
.chart .tick{font-size:11px;fill:#555}.chart .axis{font-size:12px;fill:#333}
.chart .legend{font-size:12px;fill:#222}.chart .host{font-size:13px;font-weight:600;fill:#222}
.chart .addr,.chart .pkt-label,.chart .time,.chart .stall-label,.chart .stall-cause,.chart .gap{font-family:"DejaVu Sans Mono",ui-monospace,monospace}
.chart .addr{font-size:11px;fill:#444}.chart .gap{font-size:11px;fill:#888}
.chart .pkt-label{font-size:11px;fill:#222}.chart .pkt-label.hot{fill:#b03a2e;font-weight:700}
.chart .time{font-size:10.5px;fill:#666}
.chart .stall-label{font-size:12px;font-weight:700;fill:#b03a2e}.chart .stall-cause{font-size:11px;fill:#b03a2e}
.better{color:#1e8449;font-weight:600}.worse{color:#b03a2e;font-weight:600}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:8px 0}
table.slowest th,table.slowest td{font-size:12px;padding:4px 6px}table.slowest td{font-family:ui-monospace,"DejaVu Sans Mono",monospace;white-space:nowrap}
footer{color:#888;font-size:12px;margin-top:30px}
"#;

fn status_class(s: LayerStatus) -> &'static str {
    s.name()
}

/// Renders the whole report as one HTML document.
pub fn html(d: &Diagnosis) -> String {
    let mut o = String::new();
    head(&mut o, d);
    verdict(&mut o, d);
    fix(&mut o, d);
    verify(&mut o, d);
    layers(&mut o, d);
    passive(&mut o, d);
    chart(&mut o, d);
    slowest(&mut o, d);
    profile(&mut o, d);
    flow(&mut o, d);
    evidence(&mut o, d);
    o
}

/// The document head and the title lines (target, concurrency, run time).
fn head(o: &mut String, d: &Diagnosis) {
    let v = &d.verdict;
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>lagtrace: {} — {}</title><style>{CSS}</style></head><body><main>",
        esc(v.cause.code()),
        esc(&d.target.url)
    );
    // Real clients' traffic is named by its connections, never as a concurrency.
    let load = d
        .layers
        .app
        .get()
        .and_then(|a| a.cn.as_ref())
        .map_or_else(|| format!("c={}", d.settings.concurrency), |r| r.label());
    let _ = write!(
        o,
        "<h1>lagtrace diagnose <code>{}</code></h1><div class=\"sub\">{} ({}:{}) · {} · {:.1} s</div>",
        esc(&d.target.url),
        esc(&d.target.host),
        esc(&d.target.addr),
        d.target.port,
        esc(&load),
        d.elapsed_us as f64 / 1e6
    );
    let date = match d.started_unix_us {
        0 => "run date not recorded".to_string(),
        us => format!("run {}", utc(us)),
    };
    let version = if d.lagtrace_version.is_empty() {
        env!("CARGO_PKG_VERSION")
    } else {
        &d.lagtrace_version
    };
    let _ = write!(
        o,
        "<div class=\"sub\" id=\"run\">{} · lagtrace {}</div>",
        esc(&date),
        esc(version)
    );
}

/// `us` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian calendar,
/// Howard Hinnant's days-to-civil algorithm: no time-zone database needed for UTC).
pub(crate) fn utc(us: u64) -> String {
    let secs = us / 1_000_000;
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        sod / 3_600,
        sod % 3_600 / 60,
        sod % 60
    )
}

/// The verdict box: cause, confidence, summary, cost, tail, secondary causes.
fn verdict(o: &mut String, d: &Diagnosis) {
    let v = &d.verdict;
    let class = match v.cause {
        Cause::Healthy => "ok",
        Cause::Unreachable => "down",
        _ => "bad",
    };
    let _ = write!(
        o,
        "<section class=\"verdict {class}\" id=\"verdict\"><span class=\"cause\">{}</span><span class=\"conf\">confidence {}</span><p>{}</p>",
        esc(v.cause.code()),
        v.confidence.name(),
        esc(&v.summary)
    );
    if let Some(h) = &v.hop {
        // The request's way, the process where the cause sits marked.
        o.push_str("<p class=\"chain\" id=\"hop\"><b>Where:</b> ");
        for (i, n) in h.chain.iter().enumerate() {
            if i > 0 {
                o.push_str(" <span class=\"arrow\">→</span> ");
            }
            let label = esc(&n.label());
            if i == h.at {
                let _ = write!(o, "<mark class=\"at\">{label}</mark>");
            } else {
                let _ = write!(o, "<span class=\"node\">{label}</span>");
            }
        }
        o.push_str("</p>");
    }
    if !v.cost.text.is_empty() {
        let _ = write!(o, "<p><b>Cost:</b> {}</p>", esc(&v.cost.text));
    }
    if let Some(t) = &v.tail {
        let _ = write!(o, "<p><b>Tail:</b> {}</p>", esc(&t.text));
    }
    if !v.secondary.is_empty() {
        let s: Vec<&str> = v.secondary.iter().map(|c| c.code()).collect();
        let _ = write!(o, "<p><b>Also:</b> {}</p>", esc(&s.join(", ")));
    }
    o.push_str("</section>");
}

/// The fix table, when the verdict has fixes.
fn fix(o: &mut String, d: &Diagnosis) {
    let v = &d.verdict;
    if !v.fix.is_empty() {
        o.push_str("<h2>Fix</h2><table id=\"fix\"><tr><th>side</th><th>where</th><th>change</th><th>trade-off</th></tr>");
        for f in &v.fix {
            let side = match f.side {
                FixSide::Server => "server",
                FixSide::Client => "client",
                FixSide::Path => "path",
            };
            let _ = write!(
                o,
                "<tr><td>{side}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                f.location
                    .as_deref()
                    .map(|l| format!("<code>{}</code>", esc(l)))
                    .unwrap_or_default(),
                esc(&f.change),
                esc(f.tradeoff.as_deref().unwrap_or(""))
            );
        }
        o.push_str("</table>");
    }
}

/// The before → after table of a `--verify` run.
fn verify(o: &mut String, d: &Diagnosis) {
    if let Some(vf) = &d.verify {
        let _ = write!(
            o,
            "<h2>Verify: before → after</h2><p class=\"sub\">baseline {}: <code>{}</code> → <code>{}</code></p><table id=\"verify\"><tr><th>run</th><th>metric</th><th>before</th><th>after</th><th>change</th></tr>",
            esc(&vf.baseline),
            vf.before_cause,
            vf.after_cause
        );
        for r in &vf.rows {
            let (b, a) = if r.metric == "req/s" {
                (format!("{:.0}", r.before), format!("{:.0}", r.after))
            } else {
                (crate::ms(r.before as u64), crate::ms(r.after as u64))
            };
            let (cls, ch) = if r.improvement >= 1.0 {
                ("better", format!("{:.1}× better", r.improvement))
            } else {
                (
                    "worse",
                    format!("{:.1}× worse", 1.0 / r.improvement.max(1e-9)),
                )
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{cls}\">{}</td></tr>",
                esc(&r.run),
                esc(&r.metric),
                esc(&b),
                esc(&a),
                esc(&ch)
            );
        }
        o.push_str("</table>");
    }
}

/// One row per layer: status and what it measured.
fn layers(o: &mut String, d: &Diagnosis) {
    o.push_str("<h2>Layers</h2><table id=\"layers\"><tr><th>layer</th><th>status</th><th>what it measured</th></tr>");
    for l in LayerName::ALL {
        let st = d.layers.status(l);
        let _ = write!(
            o,
            "<tr><td>{}</td><td class=\"st {}\">{}</td><td>{}</td></tr>",
            l.name(),
            status_class(st),
            st.name(),
            esc(&layer_summary(d, l))
        );
    }
    o.push_str("</table>");
}

/// Latency by percentile: c=1 and c=N, and the baseline's when verifying.
fn chart(o: &mut String, d: &Diagnosis) {
    let mut series = Vec::new();
    if let Some(a) = d.layers.app.get() {
        if let Some(r) = a.c1.as_ref().filter(|r| r.requests > 0) {
            series.push(Series::of_run("c=1".into(), "#2471a3", false, r));
        }
        if let Some(r) = a.cn.as_ref().filter(|r| r.requests > 0) {
            series.push(Series::of_run(r.label(), "#b03a2e", false, r));
        }
    }
    if let Some(b) = d.verify.as_ref().and_then(|v| v.before_app.as_ref()) {
        for l in series.iter_mut() {
            l.label.push_str(" after");
        }
        if let Some(r) = b.c1.as_ref().filter(|r| r.requests > 0) {
            series.push(Series::of_run("c=1 before".into(), "#85c1e9", true, r));
        }
        if let Some(r) = b.cn.as_ref().filter(|r| r.requests > 0) {
            series.push(Series::of_run(
                format!("{} before", r.label()),
                "#f1948a",
                true,
                r,
            ));
        }
    }
    o.push_str("<h2>Latency by percentile</h2><div class=\"charts\">");
    if series.is_empty() {
        o.push_str("<p class=\"sub\">no request completed: nothing to chart</p>");
    } else {
        o.push_str(&percentile_chart(&series));
    }
    tail_decomposition(o, d);
    o.push_str("</div>");
    timelines(o, d);
}

/// The verdict's tail as a stacked bar next to the percentile chart, when there is one.
fn tail_decomposition(o: &mut String, d: &Diagnosis) {
    let Some(t) = &d.verdict.tail else {
        return;
    };
    let p50 = t.latency_us.saturating_sub(t.excess_us);
    let _ = write!(
        o,
        "<figure id=\"tail\"><figcaption class=\"sub\">what the p{} requests wait for beyond the p50: {}</figcaption>{}</figure>",
        t.percentile,
        esc(&t.text),
        tail_bar(t, p50)
    );
}

/// One timeline per load run that kept per-request records.
fn timelines(o: &mut String, d: &Diagnosis) {
    let Some(a) = d.layers.app.get() else {
        return;
    };
    let runs: Vec<_> = [a.c1.as_ref(), a.cn.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let mut head = false;
    for r in runs {
        let Some(recs) = r.records.as_ref() else {
            continue;
        };
        let label = r.label();
        let Some(svg) = timeline(&label, recs) else {
            continue;
        };
        if !head {
            o.push_str("<h2>Requests over time</h2>");
            head = true;
        }
        let _ = write!(
            o,
            "<figure><figcaption class=\"sub\">{}</figcaption>{svg}</figure>",
            esc(&timeline_caption(&label, recs))
        );
    }
}

/// Where a passive run's requests came from (the real clients), when it was one.
fn passive(o: &mut String, d: &Diagnosis) {
    let Some(a) = d.layers.app.get() else {
        return;
    };
    for r in [a.c1.as_ref(), a.cn.as_ref()].into_iter().flatten() {
        if let Some(p) = &r.passive {
            o.push_str("<h2>Real clients' traffic (passive: nothing was sent)</h2>");
            o.push_str(&passive_table(p));
        }
    }
}

/// Per load run with records joined to its packets: its slowest requests, part by part.
fn slowest(o: &mut String, d: &Diagnosis) {
    let (Some(a), Some(p)) = (d.layers.app.get(), d.layers.packets.get()) else {
        return;
    };
    let mut head = false;
    for r in [a.c1.as_ref(), a.cn.as_ref()].into_iter().flatten() {
        let (Some(recs), Some(join)) = (
            r.records.as_ref(),
            p.joins.iter().find(|j| j.concurrency == r.concurrency),
        ) else {
            continue;
        };
        let label = r.label();
        let why = crate::slowest::unmatched_reason(p);
        let Some(table) = slowest_table(&label, recs, join, &why) else {
            continue;
        };
        if !head {
            o.push_str("<h2>The slowest requests, part by part</h2>");
            head = true;
        }
        let _ = write!(
            o,
            "<figure><figcaption class=\"sub\">{}</figcaption>{table}</figure>",
            esc(&slowest_caption(&label, recs, join, &why))
        );
    }
}

/// The server's on-CPU flame graph, when the host layer sampled its threads.
fn profile(o: &mut String, d: &Diagnosis) {
    let Some(h) = d.layers.host.get() else {
        return;
    };
    let Some(p) = h.oncpu.get() else {
        return;
    };
    let who = match (&h.scope.comm, h.scope.pid) {
        (Some(c), Some(pid)) => format!("{c} (pid {pid})"),
        (None, Some(pid)) => format!("pid {pid}"),
        _ => "the server".to_string(),
    };
    let title = format!(
        "{who} on a CPU: {} samples at {} Hz (~{:.2} s of CPU)",
        p.samples,
        p.hz,
        p.samples as f64 / p.hz.max(1) as f64
    );
    let Some(svg) = flame_graph(&p.folded, &title) else {
        return;
    };
    let mut caption = "Each box is a function, as wide as its share of the samples, its caller \
                       below it; kernel functions orange, code without a symbol (a stripped \
                       library) grey by its file name. Hover a box for its samples."
        .to_string();
    if p.user_depth <= 1 {
        caption.push_str(
            " User stacks are one frame deep: the binaries keep no frame pointers, so the \
             function on the CPU is known, its callers are not.",
        );
    }
    if p.folded_left_out > 0 {
        let _ = write!(
            caption,
            " {} samples in rarer stacks are left out.",
            p.folded_left_out
        );
    }
    if let Some(hint) = &p.hint {
        let _ = write!(caption, " Hint: {hint}.");
    }
    let _ = write!(
        o,
        "<h2>Where the server's CPU time goes</h2><figure id=\"flame\"><figcaption \
         class=\"sub\">{}</figcaption>{svg}</figure>",
        esc(&caption)
    );
}

/// The example stream's flow graph, when the packets layer kept one.
fn flow(o: &mut String, d: &Diagnosis) {
    if let Some(f) = d.layers.packets.get().and_then(|p| p.example_flow.as_ref()) {
        let _ = write!(
            o,
            "<h2>Flow graph of stream {} ({} → {})</h2>",
            f.stream,
            esc(&f.client),
            esc(&f.server)
        );
        o.push_str(&flow_ladder(f));
    }
}

/// The evidence list and the footer.
fn evidence(o: &mut String, d: &Diagnosis) {
    o.push_str("<h2>Evidence</h2><ul class=\"ev\" id=\"evidence\">");
    for e in &d.evidence {
        let cls = match e.stance {
            Stance::Supports => "supports",
            Stance::RulesOut => "rules-out",
            Stance::Note => "note",
        };
        let _ = write!(
            o,
            "<li class=\"{cls}\"><span class=\"tag\">{}</span> {}</li>",
            e.layer.name(),
            esc(&e.text)
        );
    }
    o.push_str("</ul>");
    let _ = writeln!(
        o,
        "<footer>lagtrace {} · JSON schema {} · + supports the verdict, − rules out an alternative, · note</footer></main></body></html>",
        env!("CARGO_PKG_VERSION"),
        d.schema_version
    );
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_dates_match_the_calendar() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // `date -u -d @951782400` (a leap day) and `date -u -d @1795439696`.
        assert_eq!(utc(951_782_400_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_439_696_000_000), "2026-11-23 13:14:56 UTC");
    }
}
