//! RTT statistics (µs, fractional: the clocks give ns).

use serde::{Deserialize, Serialize};

/// Summary of a set of RTTs, in microseconds. All zero when there are none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RttStats {
    /// Number of RTT samples.
    pub n: usize,
    /// Smallest.
    pub min_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Standard deviation (ping's "mdev": sqrt(mean(x²) − mean²)).
    pub mdev_us: f64,
    /// 10th percentile (nearest rank).
    pub p10_us: f64,
    /// Median (nearest rank).
    pub p50_us: f64,
    /// 90th percentile (nearest rank).
    pub p90_us: f64,
    /// Most recent sample (in the order given).
    pub last_us: f64,
}

impl RttStats {
    /// Computes the summary of `rtts` (in the order they were taken).
    pub fn of(rtts: &[f64]) -> RttStats {
        if rtts.is_empty() {
            return RttStats::default();
        }
        let n = rtts.len();
        let mut s = rtts.to_vec();
        s.sort_by(f64::total_cmp);
        let mean = s.iter().sum::<f64>() / n as f64;
        let var = (s.iter().map(|x| x * x).sum::<f64>() / n as f64 - mean * mean).max(0.0);
        let pct = |p: f64| {
            let rank = ((p / 100.0) * n as f64).ceil() as usize;
            s[rank.clamp(1, n) - 1]
        };
        RttStats {
            n,
            min_us: s[0],
            avg_us: mean,
            max_us: s[n - 1],
            mdev_us: var.sqrt(),
            p10_us: pct(10.0),
            p50_us: pct(50.0),
            p90_us: pct(90.0),
            last_us: rtts[n - 1],
        }
    }
}

/// Loss in percent (0 when nothing was sent).
pub fn loss_pct(sent: u64, received: u64) -> f64 {
    if sent == 0 {
        0.0
    } else {
        100.0 * (sent.saturating_sub(received)) as f64 / sent as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_known_values() {
        let s = RttStats::of(&[3.0, 1.0, 2.0, 4.0, 10.0]);
        assert_eq!(s.n, 5);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.max_us, 10.0);
        assert_eq!(s.avg_us, 4.0);
        assert_eq!(s.p50_us, 3.0);
        assert_eq!(s.p10_us, 1.0);
        assert_eq!(s.p90_us, 10.0);
        assert_eq!(s.last_us, 10.0);
        // mean(x²) = (9+1+4+16+100)/5 = 26; 26 − 16 = 10
        assert!((s.mdev_us - 10f64.sqrt()).abs() < 1e-9);
        assert_eq!(RttStats::of(&[]), RttStats::default());
        assert_eq!(loss_pct(4, 1), 75.0);
        assert_eq!(loss_pct(0, 0), 0.0);
    }
}
