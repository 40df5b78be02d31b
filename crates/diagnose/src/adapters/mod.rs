//! One adapter per layer: each converts its engine's report into the evidence model.
//! The rules never see an engine's types, so an engine can change without touching them.

pub mod app;
pub mod host;
pub mod packets;
pub mod path;
pub mod sockets;

use crate::evidence::Percentiles;

/// Percentiles of a list of µs values (nearest rank).
pub fn percentiles_of(values: &mut [u64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let n = values.len();
    let at = |q: f64| values[(((n - 1) as f64) * q).round() as usize];
    Some(Percentiles {
        count: n as u64,
        min_us: values[0],
        mean_us: values.iter().sum::<u64>() / n as u64,
        p50_us: at(0.5),
        p90_us: at(0.9),
        p99_us: at(0.99),
        p999_us: at(0.999),
        max_us: values[n - 1],
    })
}
