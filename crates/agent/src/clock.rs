//! The clock offset between client and agent, NTP-style (RFC 5905's on-wire calculation).
//!
//! Each exchange gives four times: t1 (client sends), t2 (agent receives), t3 (agent
//! replies), t4 (client receives). offset θ = ((t2 − t1) + (t3 − t4)) / 2 and round trip
//! δ = (t4 − t1) − (t3 − t2). Whatever the split of δ between the two directions, the true
//! offset lies within θ ± δ/2; the exchange with the smallest δ gives the tightest bound.

use serde::{Deserialize, Serialize};

/// One exchange's four timestamps (ns since the epoch, each on its own host's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exchange {
    /// Client sends.
    pub t1: i64,
    /// Agent receives.
    pub t2: i64,
    /// Agent replies.
    pub t3: i64,
    /// Client receives.
    pub t4: i64,
}

/// The agent's clock minus the client's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClockOffset {
    /// Offset (ns): add to a client time to get the agent's, subtract from an agent's.
    pub offset_ns: i64,
    /// The true offset lies within `offset_ns ± uncertainty_ns`.
    pub uncertainty_ns: i64,
    /// Round trip of the exchange used (ns).
    pub rtt_ns: i64,
    /// Exchanges made.
    pub samples: usize,
}

/// The estimate from the exchange with the smallest round trip; `None` without exchanges.
pub fn estimate(xs: &[Exchange]) -> Option<ClockOffset> {
    let best = xs
        .iter()
        .filter(|x| x.t4 >= x.t1 && x.t3 >= x.t2)
        .min_by_key(|x| (x.t4 - x.t1) - (x.t3 - x.t2))?;
    let rtt = ((best.t4 - best.t1) - (best.t3 - best.t2)).max(0);
    Some(ClockOffset {
        offset_ns: ((best.t2 - best.t1) + (best.t3 - best.t4)) / 2,
        // Half the round trip, at least 1 µs for the clocks' reading granularity.
        uncertainty_ns: (rtt / 2).max(1_000),
        rtt_ns: rtt,
        samples: xs.len(),
    })
}

impl std::fmt::Display for ClockOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.3} ms ± {:.3} ms",
            self.offset_ns as f64 / 1e6,
            self.uncertainty_ns as f64 / 1e6
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_min_rtt_exchange_bounds_the_offset() {
        // Agent 5 ms ahead; one-way delays 100 µs out / 300 µs back, then a slow one.
        let skew = 5_000_000;
        let x = |t1: i64, out: i64, serve: i64, back: i64| Exchange {
            t1,
            t2: t1 + out + skew,
            t3: t1 + out + serve + skew,
            t4: t1 + out + serve + back,
        };
        let e = estimate(&[
            x(0, 2_000_000, 10_000, 50_000),
            x(10, 100_000, 5_000, 300_000),
        ])
        .unwrap();
        assert_eq!(e.rtt_ns, 400_000);
        assert!((e.offset_ns - skew).abs() <= e.uncertainty_ns, "{e:?}");
        assert_eq!(e.samples, 2);
        assert!(estimate(&[]).is_none());
    }
}
