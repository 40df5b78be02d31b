//! Latency finding kinds: what a capture analysis can name.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A kind of latency finding. JSON and text use the kebab-case strings of [`Self::as_str`];
/// the declaration order is the report order ([`Self::ALL`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// A Nagle hold released only by the peer's delayed ACK: the reference 40 ms case.
    NagleDelayedAck,
    /// A sender held a small segment until its previous small segment was acknowledged.
    NagleStall,
    /// An ACK ≥ 30 ms after the data it acknowledges, with no data to carry it, that the
    /// sender's next data waited for.
    DelayedAck,
    /// A small segment that left only with the peer's ACK, on a connection whose sender is
    /// seen sending small segments unheld in the same state (TCP_NODELAY on): not Nagle, but
    /// held before the wire (a local drop retransmitted on the ACK, or a queue).
    HeldUntilAck,
    /// A segment that left late after packets of its sender the capture never saw (its IPv4
    /// identifications skip them): dropped before the capture point (netfilter, a qdisc, or
    /// the capture itself) and sent again — on a timer, where a cork would have left it at
    /// the same ~200 ms.
    DroppedBeforeCapture,
    /// A retransmitted segment (detail: `rto`, `fast` or `spurious`).
    Retransmission,
    /// A retransmitted SYN or SYN-ACK: connection setup waited for a timer.
    SynRetransmit,
    /// A receiver advertised a zero window.
    ZeroWindow,
    /// The sender filled the receiver's window and waited for it to open.
    WindowFull,
    /// A partial segment released at the ~200 ms TCP_CORK ceiling with nothing to explain it.
    TcpCork,
    /// The server's time from request to first response byte dominates the transaction.
    SlowServer,
}

impl FindingKind {
    /// All kinds, in report order.
    pub const ALL: [FindingKind; 11] = [
        FindingKind::NagleDelayedAck,
        FindingKind::NagleStall,
        FindingKind::DelayedAck,
        FindingKind::HeldUntilAck,
        FindingKind::DroppedBeforeCapture,
        FindingKind::Retransmission,
        FindingKind::SynRetransmit,
        FindingKind::ZeroWindow,
        FindingKind::WindowFull,
        FindingKind::TcpCork,
        FindingKind::SlowServer,
    ];

    /// The stable string (as in JSON).
    pub const fn as_str(self) -> &'static str {
        match self {
            FindingKind::NagleDelayedAck => "nagle-delayed-ack",
            FindingKind::NagleStall => "nagle-stall",
            FindingKind::DelayedAck => "delayed-ack",
            FindingKind::HeldUntilAck => "held-until-ack",
            FindingKind::DroppedBeforeCapture => "dropped-before-capture",
            FindingKind::Retransmission => "retransmission",
            FindingKind::SynRetransmit => "syn-retransmit",
            FindingKind::ZeroWindow => "zero-window",
            FindingKind::WindowFull => "window-full",
            FindingKind::TcpCork => "tcp-cork",
            FindingKind::SlowServer => "slow-server",
        }
    }

    /// Position in [`Self::ALL`] (a dense index for per-kind tables and bit sets).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The kind named by its stable string.
    pub fn from_name(s: &str) -> Option<FindingKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the kind is a stall that waited for an ACK (Nagle or delayed ACK).
    pub const fn is_ack_stall(self) -> bool {
        matches!(
            self,
            FindingKind::NagleDelayedAck | FindingKind::NagleStall | FindingKind::DelayedAck
        )
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad` keeps width and alignment (`{:<18}`) working as they did for strings.
        f.pad(self.as_str())
    }
}

impl PartialEq<str> for FindingKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for FindingKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<FindingKind> for &str {
    fn eq(&self, other: &FindingKind) -> bool {
        *self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_are_the_stable_strings() {
        for k in FindingKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<FindingKind>(&json).unwrap(), k);
            assert_eq!(FindingKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(FindingKind::NagleDelayedAck.as_str(), "nagle-delayed-ack");
        assert_eq!(FindingKind::TcpCork.as_str(), "tcp-cork");
        assert_eq!(FindingKind::from_name("nagle"), None);
    }

    #[test]
    fn index_is_the_report_order() {
        for (i, k) in FindingKind::ALL.into_iter().enumerate() {
            assert_eq!(k.index(), i);
        }
    }

    #[test]
    fn display_pads_like_a_string() {
        assert_eq!(format!("{:<12}|", FindingKind::TcpCork), "tcp-cork    |");
        assert!(FindingKind::SlowServer == "slow-server");
    }
}
