//! Percentiles and the latency of the transactions kept in detail.

use lagtrace_model::analyze::{Transaction, TransactionStats};

/// Nearest-rank percentile of sorted values (0 when empty).
pub(super) fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let idx = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

/// Request-to-last-byte and server-time percentiles of complete transactions.
pub(super) fn transaction_stats(transactions: &[Transaction]) -> TransactionStats {
    let mut total: Vec<u64> = transactions
        .iter()
        .filter_map(|t| t.time_to_last_byte_us)
        .collect();
    let mut server: Vec<u64> = transactions
        .iter()
        .filter_map(|t| t.server_time_us)
        .collect();
    total.sort_unstable();
    server.sort_unstable();
    TransactionStats {
        complete: total.len() as u64,
        median_us: percentile(&total, 0.5),
        p99_us: percentile(&total, 0.99),
        max_us: total.last().copied().unwrap_or(0),
        median_server_us: percentile(&server, 0.5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 0.99), 7);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&[1, 2, 3, 4], 0.5), 2);
    }
}
