//! lagtrace-report: renders a [`Diagnosis`] as terminal text, JSON, or one self-contained
//! HTML file (inline CSS and SVG, no external assets).
//!
//! The renderers only read the diagnosis; they compute nothing the verdict depends on.
#![deny(missing_docs)]

mod flame;
mod html;
mod ladder;
mod slowest;
mod svg;
mod tail;
mod text;

use lagtrace_model::diagnosis::Diagnosis;

pub use flame::flame_graph;
pub use html::html;
pub use ladder::flow_ladder;
pub use slowest::{passive_table, slowest_caption, slowest_table};
pub use svg::{Series, percentile_chart};
pub use tail::{tail_bar, timeline, timeline_caption};
pub use text::text;

/// The stable JSON form (pretty-printed): `verdict`, `layers`, `evidence`, ...
pub fn json(d: &Diagnosis) -> String {
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string_pretty(d).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

pub(crate) fn ms(us: u64) -> String {
    lagtrace_model::Micros(us).to_string()
}
