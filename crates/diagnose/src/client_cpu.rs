//! The load generator's own host CPU contention, measured while a load phase runs: a
//! sampler thread reads `procs_running` (`/proc/stat`) and the run-queue delay of this
//! process's threads (`/proc/self/task/*/schedstat`, field 2) every [`PERIOD`], and the
//! CPU pressure (`/proc/pressure/cpu`, `some` total) before and after. Files that are
//! missing (no PSI, no schedstats) leave their field out; nothing here fails the run.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lagtrace_model::diagnosis::evidence::ClientCpu;

/// How often the sampler looks.
pub const PERIOD: Duration = Duration::from_millis(20);

/// A running sampler; [`Sampler::stop`] returns what it measured.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Samples>>,
    psi0: Option<u64>,
    t0: Instant,
}

#[derive(Default)]
struct Samples {
    runnable: Vec<u32>,
    /// Largest run delay seen per thread id, ns.
    delay_ns: HashMap<u32, u64>,
    /// Run delay of each thread at the first look, ns (it waited before the run too).
    delay0_ns: HashMap<u32, u64>,
    schedstat: bool,
}

/// `procs_running` from `/proc/stat`.
fn procs_running() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse().ok())
}

/// `some ... total=` of `/proc/pressure/cpu`, µs.
fn psi_some_us() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let l = s.lines().find(|l| l.starts_with("some "))?;
    l.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))
        .and_then(|v| v.parse().ok())
}

/// Each thread of this process and its run-queue delay so far, ns.
fn run_delays() -> Vec<(u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let s = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
            let delay = s.split_whitespace().nth(1)?.parse().ok()?;
            Some((tid, delay))
        })
        .collect()
}

fn cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
}

impl Samples {
    fn look(&mut self, first: bool) {
        if let Some(n) = procs_running() {
            self.runnable.push(n);
        }
        for (tid, d) in run_delays() {
            self.schedstat = true;
            if first {
                self.delay0_ns.insert(tid, d);
            }
            let e = self.delay_ns.entry(tid).or_insert(d);
            *e = (*e).max(d);
        }
    }
}

impl Sampler {
    /// Starts sampling.
    pub fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("lagtrace-cpu".into())
            .spawn(move || {
                let mut x = Samples::default();
                x.look(true);
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(PERIOD);
                    x.look(false);
                }
                x
            })
            .ok();
        Sampler {
            stop,
            handle,
            psi0: psi_some_us(),
            t0: Instant::now(),
        }
    }

    /// Stops sampling; `None` when the sampler could not run or took no sample.
    pub fn stop(mut self) -> Option<ClientCpu> {
        self.stop.store(true, Ordering::Relaxed);
        let x = self.handle.take()?.join().ok()?;
        let span_us = self.t0.elapsed().as_micros() as u64;
        let psi = match (self.psi0, psi_some_us()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let mut r = x.runnable.clone();
        if r.is_empty() {
            return None;
        }
        r.sort_unstable();
        let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
        let delay_ns: u64 = x
            .delay_ns
            .iter()
            .map(|(t, d)| d.saturating_sub(x.delay0_ns.get(t).copied().unwrap_or(0)))
            .sum();
        Some(ClientCpu {
            cpus: cpus(),
            samples: u32::try_from(r.len()).unwrap_or(u32::MAX),
            runnable_p50: at(0.5),
            runnable_p90: at(0.9),
            psi_some_us: psi,
            run_delay_us: x.schedstat.then_some(delay_ns / 1000),
            span_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampler_over_a_busy_thread_sees_it_runnable() {
        let s = Sampler::start();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(120) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let c = s.stop().expect("sampled");
        assert!(x > 0);
        assert!(c.samples >= 2, "{c:?}");
        // This thread was running at every sample.
        assert!(c.runnable_p50 >= 1, "{c:?}");
        assert!(c.span_us >= 120_000, "{c:?}");
    }
}
