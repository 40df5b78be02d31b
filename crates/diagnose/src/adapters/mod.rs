//! One adapter per layer: each converts its engine's report into the evidence model.
//! The rules never see an engine's types, so an engine can change without touching them.

pub mod app;
pub mod host;
pub mod packets;
pub mod path;
pub mod sockets;

use crate::evidence::Percentiles;

/// Whether this process holds capability `c` in its effective set (root holds them all).
pub fn held(c: lagtrace_model::Capability) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|eff| eff & (1u64 << c.bit()) != 0)
}

/// `" (needs CAP_X: run as root)"` when this process lacks `c`, else nothing: said once,
/// in the layer's reason, where a missing privilege explains what a layer could not read.
pub fn missing(c: lagtrace_model::Capability) -> String {
    if held(c) {
        String::new()
    } else {
        format!(" (needs {}: run as root)", c.name())
    }
}

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
