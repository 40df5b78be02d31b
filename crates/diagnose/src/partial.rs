//! An interrupted diagnosis: the verdict is `partial` and claims no cause; it says what was
//! measured and what was not, and the layers keep the data they have.

use crate::evidence::{LayerName, LayerStatus};
use crate::verdict::{Confidence, Cost, EvidenceLine, Stance, Verdict};
use crate::{Diagnosis, Layers};
use lagtrace_model::{Cause, Micros};

/// Turns the judged diagnosis of an interrupted run into a `partial` one: no cause, no fix;
/// the evidence keeps its measurements (notes) and adds, as a note, what the data so far
/// points to (never `healthy`: a run cut short cannot show that), with the lines measured
/// for that cause. A layer whose data shows
/// a finding keeps (or gets) status `finding`: the claim withheld is the cause, not what
/// the layer measured — `ok` there would be an all-clear the data contradicts.
pub fn mark(mut d: Diagnosis) -> Diagnosis {
    let judged = d.verdict.cause;
    let (measured, missing) = coverage(&d.layers);
    let elapsed = d.elapsed_us as f64 / 1e6;
    let mut summary = format!(
        "interrupted {elapsed:.1} s into the run: no cause is claimed from partial data; \
         measured: {}",
        if measured.is_empty() {
            "nothing".to_string()
        } else {
            measured.join(", ")
        }
    );
    if !missing.is_empty() {
        summary.push_str(&format!("; not measured: {}", missing.join(", ")));
    }
    // The packets' findings are in the layer table's line: never `ok` next to them.
    let packets = &mut d.layers.packets;
    if packets.status == LayerStatus::Ok && packets.get().is_some_and(|p| !p.findings.is_empty()) {
        packets.status = LayerStatus::Finding;
    }
    let mut evidence = vec![note(format!(
        "interrupted {elapsed:.1} s into the run (load budget {:.1} s): the layers cover only \
         what ran",
        d.settings.duration_us as f64 / 1e6
    ))];
    let points = !matches!(judged, Cause::Healthy | Cause::Unreachable | Cause::Partial);
    if points {
        evidence.push(note(format!(
            "the data measured so far points to {judged} (not confirmed: run the diagnosis to \
             the end)"
        )));
    }
    // What was measured for the cause the data points to stays, with its stance (the reader
    // checks the "points to" line against it); lines for or against other causes were the
    // verdict's reasoning, which an interrupted run does not do.
    evidence.extend(d.evidence.drain(..).filter(|e| match e.cause {
        None => e.stance == Stance::Note,
        Some(c) => points && c == judged && e.stance == Stance::Supports,
    }));
    d.evidence = evidence;
    d.verdict = Verdict {
        cause: Cause::Partial,
        secondary: Vec::new(),
        confidence: Confidence::Low,
        summary,
        cost: Cost {
            p50_us: d.verdict.cost.p50_us,
            concurrency: d.verdict.cost.concurrency,
            ..Cost::default()
        },
        mechanism: None,
        tail: None,
        fix: Vec::new(),
        hop: None,
    };
    d
}

fn note(text: String) -> EvidenceLine {
    EvidenceLine {
        layer: LayerName::App,
        stance: Stance::Note,
        cause: None,
        text,
    }
}

/// The layers with data (the app's runs with their request counts), and those without.
fn coverage(layers: &Layers) -> (Vec<String>, Vec<String>) {
    let mut measured = Vec::new();
    let mut missing = Vec::new();
    for l in LayerName::ALL {
        let has_data = matches!(layers.status(l), LayerStatus::Ok | LayerStatus::Finding);
        if !has_data {
            missing.push(l.name().to_string());
            continue;
        }
        if l != LayerName::App {
            measured.push(l.name().to_string());
            continue;
        }
        let app = layers.app.get().cloned().unwrap_or_default();
        let runs: Vec<String> = [app.c1, app.cn]
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{} {} requests{}",
                    r.label(),
                    r.requests,
                    if r.requests > 0 {
                        format!(", p50 {}", Micros(r.latency.p50_us))
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        measured.push(format!("app ({})", runs.join("; ")));
    }
    (measured, missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{AppEvidence, AppRun, Layer, Target};
    use crate::{Assemble, Settings};

    fn interrupted(app: AppEvidence) -> Diagnosis {
        let layers = Layers {
            path: Layer::unavailable("no CAP_NET_RAW"),
            app: Layer::ran(app),
            packets: Layer::skipped("interrupted"),
            sockets: Layer::skipped("interrupted"),
            host: Layer::skipped("interrupted"),
            hops: Vec::new(),
        };
        let target = Target {
            url: "http://127.0.0.1:1/".into(),
            host: "127.0.0.1".into(),
            addr: "127.0.0.1".into(),
            port: 1,
        };
        let settings = Settings {
            concurrency: 32,
            duration_us: 7_000_000,
        };
        mark(Diagnosis::assemble(target, settings, layers, 500_000))
    }

    #[test]
    fn an_interrupted_run_claims_no_cause_and_says_what_it_measured() {
        let c1 = AppRun {
            concurrency: 1,
            requests: 12,
            ..AppRun::default()
        };
        let d = interrupted(AppEvidence {
            c1: Some(c1),
            cn: None,
        });
        assert_eq!(d.verdict.cause, Cause::Partial);
        assert!(d.verdict.fix.is_empty() && d.verdict.secondary.is_empty());
        assert!(
            d.verdict.summary.contains("app (c=1 12 requests"),
            "{}",
            d.verdict.summary
        );
        assert!(
            d.verdict
                .summary
                .contains("not measured: path, packets, sockets, host"),
            "{}",
            d.verdict.summary
        );
        let all = serde_json::to_string(&d).unwrap();
        assert!(!all.contains("healthy"), "{all}");
        assert!(!all.contains("\"finding\""), "{all}");
    }

    /// A run cut short in its c=N phase whose packets and sockets show Nagle: no cause is
    /// claimed, and neither layer is `ok` next to what it shows.
    #[test]
    fn an_interrupted_run_never_says_ok_next_to_a_finding() {
        use lagtrace_testkit::layers::{Synth, finding, options, target};
        let s = Synth::RULES;
        let mut layers = s.healthy_layers();
        let mut c1 = s.run(1, 41_200, 42_000, 24.0);
        c1.first_request = Some(s.pct(1, 350, 350));
        c1.later_requests = Some(s.pct(120, 41_200, 42_000));
        layers.app = Layer::ran(AppEvidence {
            c1: Some(c1),
            cn: Some(s.run(32, 43_900, 48_000, 730.0)),
        });
        let p = layers.packets.data.as_mut().unwrap();
        p.transactions = 1_000;
        p.findings = vec![finding("nagle-delayed-ack", 970, 1_000, 40_800)];
        layers.sockets.data.as_mut().unwrap().nodelay = options(0, 32);
        let settings = Settings {
            concurrency: 32,
            duration_us: 7_000_000,
        };
        let judged = Diagnosis::assemble(target(), settings, layers.clone(), 4_000_000);
        assert_eq!(judged.verdict.cause, Cause::NagleDelayedAck);
        let d = mark(judged);
        assert_eq!(d.verdict.cause, Cause::Partial);
        assert!(d.verdict.fix.is_empty());
        assert_eq!(d.layers.packets.status, LayerStatus::Finding);
        assert_eq!(d.layers.sockets.status, LayerStatus::Finding);
        // The measured lines for the cause the data points to stay, after that line; none
        // for or against another cause.
        let points = d
            .evidence
            .iter()
            .position(|e| e.text.contains("points to nagle-delayed-ack"))
            .expect("the points-to line");
        let kept: Vec<&EvidenceLine> = d.evidence[points..]
            .iter()
            .filter(|e| e.stance == Stance::Supports)
            .collect();
        assert!(
            kept.iter().any(|e| e.layer == LayerName::Packets)
                && kept.iter().any(|e| e.layer == LayerName::Sockets),
            "{:#?}",
            d.evidence
        );
        assert!(
            d.evidence
                .iter()
                .all(|e| e.cause.is_none_or(|c| c == Cause::NagleDelayedAck)),
            "{:#?}",
            d.evidence
        );
        // Findings the verdict would not use are still findings in a partial run's table.
        let mut weak = layers;
        let p = weak.packets.data.as_mut().unwrap();
        p.findings = vec![finding("delayed-ack", 10, 1_000, 40_800)];
        weak.sockets.data.as_mut().unwrap().nodelay = options(32, 0);
        let settings = Settings {
            concurrency: 32,
            duration_us: 7_000_000,
        };
        let d = mark(Diagnosis::assemble(target(), settings, weak, 4_000_000));
        assert_eq!(d.layers.packets.status, LayerStatus::Finding);
        assert_eq!(d.layers.sockets.status, LayerStatus::Ok);
    }
}
