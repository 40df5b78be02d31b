//! The verdict: one primary cause, secondary causes, a confidence, the cost in the user's
//! terms, the evidence for and against, and the fix.

use crate::Cause;
use serde::{Deserialize, Serialize};

use super::evidence::LayerName;

/// How sure the verdict is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    /// One layer's indirect evidence only.
    Low,
    /// One layer's direct evidence.
    Medium,
    /// Direct evidence corroborated by another layer.
    High,
}

impl Confidence {
    /// The stable string.
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// Whether an evidence line supports the verdict, rules out an alternative, or is a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stance {
    /// Supports the primary (or a secondary) cause.
    Supports,
    /// Rules out an alternative cause.
    RulesOut,
    /// Context.
    Note,
}

/// One line of evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceLine {
    /// The layer it comes from.
    pub layer: LayerName,
    /// What it does for the verdict.
    pub stance: Stance,
    /// The cause it is about (supported or ruled out), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// The line, with numbers.
    pub text: String,
}

/// Where a fix is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FixSide {
    /// The server (process or config).
    Server,
    /// The client.
    Client,
    /// The network path.
    Path,
}

/// One way to fix the cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fix {
    /// Server, client or path.
    pub side: FixSide,
    /// Where to change it (`/etc/nginx/nginx.conf:12`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// What to change (`tcp_nodelay off; → tcp_nodelay on;`).
    pub change: String,
    /// The price of this fix, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tradeoff: Option<String>,
}

/// The conclusion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The primary cause.
    pub cause: Cause,
    /// Further causes that add latency too, by decreasing cost.
    pub secondary: Vec<Cause>,
    /// How sure.
    pub confidence: Confidence,
    /// One sentence naming the cause in plain words.
    pub summary: String,
    /// The cost in the user's terms.
    pub cost: String,
    /// How to fix it, best first (empty when healthy).
    pub fix: Vec<Fix>,
}
