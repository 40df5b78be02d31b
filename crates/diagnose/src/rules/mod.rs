//! The verdict rules: pure functions from evidence to a verdict. No I/O, no clock.
//!
//! How it decides:
//! 1. No request succeeded and the connection could not be made → `unreachable`, with what
//!    the path layer saw (RST: nothing listens; silence: nothing answers).
//! 2. Each cause becomes a *candidate* when a layer shows it with a material effect: a packet
//!    finding on enough transactions with enough added latency, the SYN RTT rising under
//!    load, the server's own time (c=1 latency minus the path RTT, and the server time seen
//!    in the packets) being large. Socket and configuration evidence corroborate (raising the
//!    confidence) but never create a network cause on their own.
//! 3. The server's own time is "explained" by Nagle or TCP_CORK when their added latency is
//!    most of it; otherwise, when it dominates, no network cause is named as primary.
//! 4. The largest remaining expected cost (share × added latency) is the primary cause; the
//!    others are secondary.
//! 5. The tail (see `tail`): when the p99 lies beyond what contention, the path and the
//!    scheduler explain, `verdict.tail` says what the slowest requests wait for. With no
//!    candidate, the layer part that explains the tail names the cause, else
//!    `unexplained-tail`. No candidate and no such tail → `healthy`.
//!
//! ## Where things live
//! One module per cause family, each a [`CauseRule`]: its candidate, the lines that rule it
//! out when it is not chosen, its summary, its cost and its fixes. [`Facts`](facts::Facts)
//! holds what several rules read; `judge` collects the candidates, ranks them and assembles
//! the verdict. A new cause is a new module, an entry in `RULES` and `RULE_OUTS`, and a test.

mod cork;
mod facts;
mod first;
mod healthy;
mod hop;
mod host;
mod judge;
mod kernel_stack;
mod loss;
mod nagle;
mod notes;
mod queueing;
mod server_time;
mod slow_server;
mod syn;
pub mod tail;
mod tail_join;
mod unreachable;
mod window;
mod wiredrop;

use lagtrace_model::{Cause, Micros};

use crate::evidence::{FindingSummary, LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, Mechanism, Stance, Verdict};
use facts::Facts;

pub use judge::judge;

/// What the host layer shows directly (a throttled cgroup, a listener's overflows, packets
/// the host dropped): a candidate with its own evidence and fix, merged into the ranking.
pub(super) struct Direct {
    pub(super) cause: Cause,
    pub(super) mechanism: Mechanism,
    pub(super) evidence: Vec<EvidenceLine>,
    pub(super) fix: Fix,
    /// Median added latency of the requests it explains, and their share of the run.
    pub(super) added_us: u64,
    pub(super) share: f64,
    pub(super) counted: Option<(u64, Option<u64>)>,
}

/// A finding adds latency worth naming when its median added latency is at least this.
pub const MATERIAL_ADDED_US: u64 = 5_000;

/// What a passive run (real clients' traffic) cannot tell, said once in its evidence.
pub(super) const PASSIVE_LIMITS: &str = "passive: the requests are the real clients' as the \
    capture saw them, timed from their first byte (the SYN for a connection's first) to the \
    response's last byte; no request was sent, so there is no one-client (c=1) run to \
    contrast with load and no SYN ping: the server's own time and the path RTT come from the \
    packets";
/// ... and it affects at least this share of transactions (Nagle, cork, window).
pub const MATERIAL_SHARE: f64 = 0.05;
/// Retransmissions matter on a smaller share: each costs an RTO or more.
pub const MATERIAL_LOSS_SHARE: f64 = 0.005;
/// The server's own time per request worth naming on its own, whatever the path adds.
pub const SLOW_SERVER_US: u64 = 10_000;
/// Below [`SLOW_SERVER_US`], the server's own time is still the cause when it is at least
/// this long and makes up [`DOMINANT_SERVER_SHARE`] of what the user waits at c=1 (a 5 ms
/// handler on a 50 µs path is where the latency comes from; a 5 ms handler behind a 40 ms
/// path is not).
pub const DOMINANT_SERVER_US: u64 = 2_000;
/// The share of the c=1 p50 the server's own time must make up below [`SLOW_SERVER_US`].
pub const DOMINANT_SERVER_SHARE: f64 = 0.75;
/// A response that trickles out slower than this (bits/s, at c=1) on a path with no queue,
/// loss or window limit is paced by the sender: a bottleneck link TCP fills would show a
/// queue (SYN RTT rise) or losses, and a fast path carries far more.
pub const PACED_BPS: f64 = 100e6;
/// A SYN RTT rise under load worth naming (and it must be 3× the idle RTT, and the
/// application must feel it): well above what a busy CPU adds to one probe.
pub const QUEUE_RISE_US: u64 = 10_000;

/// A packet finding names the cause only when what it adds per request on average (share ×
/// median added latency) is at least this share of the typical request's latency (the main
/// run's p50). Below it the requests take their time for another reason: a bulk transfer's
/// brief window-full while its reader waits for a CPU is a side effect of the load, not where
/// the latency comes from.
pub const EXPLAINS_SHARE: f64 = 0.1;

/// Whether finding `f` accounts for [`EXPLAINS_SHARE`] of the typical request's time.
fn explains_typical(x: &Facts<'_>, f: &FindingSummary) -> bool {
    let p50 = x.main_run().map(|r| r.latency.p50_us).unwrap_or(0);
    f.share * f.median_added_us as f64 >= EXPLAINS_SHARE * p50 as f64
}

/// The verdict, its evidence, and which layers hold a finding.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The conclusion.
    pub verdict: Verdict,
    /// Evidence for it and against the alternatives.
    pub evidence: Vec<EvidenceLine>,
    /// Layers whose data supports a non-healthy cause (their status becomes `finding`).
    pub finding_layers: Vec<LayerName>,
}

/// One cause the evidence shows, before ranking.
struct Candidate {
    cause: Cause,
    /// Expected added latency per request (share × median), for ranking.
    impact_us: f64,
    /// Median added latency of an affected request.
    added_us: u64,
    /// Share of requests affected.
    share: f64,
    /// Corroborating layers.
    layers: Vec<LayerName>,
    /// Whether a layer shows the mechanism directly (packets, or a socket option).
    direct: bool,
    /// When `share` comes from a count: (affected, out of how many, when known).
    counted: Option<(u64, Option<u64>)>,
    evidence: Vec<EvidenceLine>,
    /// How, when the host layer shows it directly.
    mechanism: Option<Mechanism>,
    /// The fix the host layer's evidence points to (goes first).
    host_fix: Option<Fix>,
    /// Where on the request's way the cause sits, when a layer showed it behind the server.
    hop: Option<crate::verdict::Hop>,
}

impl Candidate {
    /// A candidate whose expected cost is `share × added_us`.
    fn new(cause: Cause, added_us: u64, share: f64, layers: Vec<LayerName>) -> Candidate {
        Candidate {
            cause,
            impact_us: share * added_us as f64,
            added_us,
            share,
            layers,
            direct: true,
            counted: None,
            evidence: Vec::new(),
            mechanism: None,
            host_fix: None,
            hop: None,
        }
    }

    /// The cost in numbers, with `text` saying it in the user's terms.
    fn cost(&self, x: &Facts<'_>, text: String) -> Cost {
        let run = x.main_run();
        Cost {
            added_us: self.added_us,
            share: self.share,
            affected: self.counted.map(|c| c.0),
            of: self.counted.and_then(|c| c.1),
            p50_us: run.map(|r| r.latency.p50_us),
            concurrency: run.map(|r| r.concurrency),
            p50_without_us: None,
            text,
        }
    }
}

/// One cause family: everything the rules know about it, in one place.
trait CauseRule: Sync {
    /// The cause this rule names.
    fn cause(&self) -> Cause;
    /// A network cause is never primary while the server's own time dominates.
    fn network(&self) -> bool {
        false
    }
    /// The cause as the evidence shows it, with its cost and supporting lines; `None` when
    /// no layer shows it with a material effect.
    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate>;
    /// A candidate only when nothing else explains the latency (inferred from absence).
    fn fallback(&self, _x: &Facts<'_>) -> Option<Candidate> {
        None
    }
    /// Lines that rule the cause out (or note what was seen) when no candidate in `chosen`
    /// names it.
    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine>;
    /// One sentence naming the cause in plain words.
    fn summary(&self) -> &'static str;
    /// The cost of the chosen candidate in the user's terms.
    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost;
    /// How to fix it, best first.
    fn fixes(&self, c: &Candidate, x: &Facts<'_>, target: &Target) -> Vec<Fix>;
}

/// Every candidate-based cause, in the order their candidates are collected and their
/// rule-out lines are written (ranking is by cost; ties keep this order).
static RULES: [&dyn CauseRule; 8] = [
    &nagle::Nagle,
    &cork::Cork,
    &loss::Loss,
    &syn::Syn,
    &window::Window,
    &queueing::Queueing,
    &kernel_stack::KernelStack,
    &slow_server::SlowServer,
];

/// The same rules in the order their rule-out lines are written (then grouped by layer).
static RULE_OUTS: [&dyn CauseRule; 8] = [
    &queueing::Queueing,
    &kernel_stack::KernelStack,
    &slow_server::SlowServer,
    &loss::Loss,
    &nagle::Nagle,
    &cork::Cork,
    &syn::Syn,
    &window::Window,
];

/// The rule that names `cause` (none for `healthy` and `unreachable`).
fn rule(cause: Cause) -> Option<&'static dyn CauseRule> {
    RULES.iter().copied().find(|r| r.cause() == cause)
}

fn has(chosen: &[Candidate], cause: Cause) -> bool {
    chosen.iter().any(|k| k.cause == cause)
}

fn ms(us: u64) -> String {
    Micros(us).to_string()
}

fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// "p99", "p99.9", "p99.93": a percentile to two decimals at most, rounded down (the
/// requests above it are never fewer than said).
fn percentile_label(p: f64) -> String {
    format!("p{}", two_decimals_down(p))
}

/// `p` rounded down to two decimals (99.929 → 99.92; 99.9 stays 99.9 whatever its binary
/// form).
fn two_decimals_down(p: f64) -> f64 {
    (p * 100.0 + 1e-6).floor() / 100.0
}

fn rate_text(bps: f64) -> String {
    if bps >= 1e6 {
        format!("{:.1} Mbit/s", bps / 1e6)
    } else {
        format!("{:.0} kbit/s", bps / 1e3)
    }
}

fn line(layer: LayerName, stance: Stance, cause: Option<Cause>, text: String) -> EvidenceLine {
    EvidenceLine {
        layer,
        stance,
        cause,
        text,
    }
}

fn sup(layer: LayerName, cause: Cause, text: String) -> EvidenceLine {
    line(layer, Stance::Supports, Some(cause), text)
}

fn out(layer: LayerName, cause: Cause, text: String) -> EvidenceLine {
    line(layer, Stance::RulesOut, Some(cause), text)
}

fn note(layer: LayerName, text: String) -> EvidenceLine {
    line(layer, Stance::Note, None, text)
}

/// Frame numbers as a reader finds them in Wireshark: `#17 #18 #52`.
fn frames_text(frames: &[u64]) -> String {
    let f: Vec<String> = frames.iter().map(|n| format!("#{n}")).collect();
    f.join(" ")
}

fn example_text(f: &FindingSummary) -> String {
    match f.examples.first() {
        Some(e) => {
            format!(
                "; e.g. stream {} frames {} at {:.6}s: {}{}",
                e.stream,
                frames_text(&e.frames),
                e.time_us as f64 / 1e6,
                ms(e.added_us),
                if e.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", e.note)
                }
            )
        }
        None => String::new(),
    }
}

fn finding_text(f: &FindingSummary, total: u64) -> String {
    format!(
        "{}: {} of {} transactions ({}), median +{}, p99 +{}{}",
        f.kind,
        f.transactions,
        total,
        pct(f.share),
        ms(f.median_added_us),
        ms(f.p99_added_us),
        example_text(f)
    )
}

fn material(f: &FindingSummary, min_share: f64) -> bool {
    f.share >= min_share && f.median_added_us >= MATERIAL_ADDED_US
}

/// The rules stay independent: a rule reads facts and returns a candidate, and `judge`
/// alone assembles them. Checked on the sources, so an import that would tangle them fails
/// here rather than in review.
#[cfg(test)]
mod independence {
    use std::collections::BTreeSet;

    /// One module per cause family (or verdict): none may name another.
    const RULE_MODULES: &[&str] = &[
        "cork",
        "healthy",
        "hop",
        "host",
        "kernel_stack",
        "loss",
        "nagle",
        "queueing",
        "server_time",
        "slow_server",
        "syn",
        "tail",
        "unreachable",
        "window",
        "wiredrop",
    ];
    /// What several rules read: they name no rule module either.
    const SHARED: &[&str] = &["facts", "first", "notes", "tail_join"];
    /// The assembly (and this registry) may name every rule.
    const ASSEMBLY: &[&str] = &["judge", "mod"];

    /// A module's source without its comment lines (a doc link is no import).
    fn code(module: &str) -> String {
        let path = format!("{}/src/rules/{module}.rs", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn ident(s: &str) -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }

    /// The sibling modules `src` names through `super::` or `crate::rules::` paths, the
    /// members of `use super::{…}` groups included.
    fn named(src: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for prefix in ["super::", "crate::rules::"] {
            let mut rest = src;
            while let Some(i) = rest.find(prefix) {
                rest = &rest[i + prefix.len()..];
                match rest.strip_prefix('{') {
                    Some(group) => {
                        let end = group.find('}').unwrap_or(group.len());
                        out.extend(group[..end].split(',').map(ident));
                    }
                    None => {
                        out.insert(ident(rest));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_check_sees_paths_and_groups() {
        let n = named(
            "use super::{Candidate, facts::Facts, tail};\n// super::host in a comment\n\
             let d = crate::rules::wiredrop::dropped(x);",
        );
        for m in ["Candidate", "facts", "tail", "wiredrop"] {
            assert!(n.contains(m), "{m} not in {n:?}");
        }
        assert!(code("judge").contains("fn judge"));
        assert!(
            !code("judge")
                .lines()
                .any(|l| l.trim_start().starts_with("//"))
        );
    }

    #[test]
    fn no_rule_module_imports_another() {
        for m in RULE_MODULES.iter().chain(SHARED) {
            let bad: Vec<String> = named(&code(m))
                .into_iter()
                .filter(|n| n != m && RULE_MODULES.contains(&n.as_str()))
                .collect();
            assert!(
                bad.is_empty(),
                "rules/{m}.rs names the rule module(s) {bad:?}: a rule reads facts (facts.rs, \
                 notes.rs, tail_join.rs) and returns a candidate; only judge.rs combines rules"
            );
        }
    }

    #[test]
    fn every_module_is_classified() {
        let dir = format!("{}/src/rules", env!("CARGO_MANIFEST_DIR"));
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let Some(m) = name.strip_suffix(".rs") else {
                continue;
            };
            if m.ends_with("_tests") {
                continue;
            }
            assert!(
                RULE_MODULES.contains(&m) || SHARED.contains(&m) || ASSEMBLY.contains(&m),
                "rules/{name}: add it to RULE_MODULES, SHARED or ASSEMBLY"
            );
        }
    }
}
