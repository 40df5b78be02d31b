//! Per-thread scheduler accounting: `/proc/PID/task/TID/schedstat` is `run_ns wait_ns slices`
//! (time on a CPU, time runnable but waiting in a run queue, times scheduled in).

use std::collections::BTreeMap;

use lagtrace_model::host::{SchedSample, ThreadSched, ThreadWait};

/// One thread's reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadReading {
    /// Thread name.
    pub name: String,
    /// On-CPU time, ns.
    pub run_ns: u64,
    /// Run-queue wait, ns.
    pub wait_ns: u64,
    /// Timeslices.
    pub slices: u64,
}

/// Parses a schedstat line.
pub fn parse(text: &str) -> Option<(u64, u64, u64)> {
    let mut f = text.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((f.next()??, f.next()??, f.next()??))
}

/// Every thread of `pid`, by tid.
pub fn read(pid: u32) -> std::io::Result<BTreeMap<u32, ThreadReading>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path().join("schedstat")) else {
            continue; // exited meanwhile
        };
        let Some((run_ns, wait_ns, slices)) = parse(&text) else {
            continue;
        };
        let name = std::fs::read_to_string(e.path().join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        out.insert(
            tid,
            ThreadReading {
                name,
                run_ns,
                wait_ns,
                slices,
            },
        );
    }
    Ok(out)
}

/// Every thread of each of `pids` (a pre-forked server's master and workers), by tid; an
/// error only when the first process cannot be read (the others may have exited).
pub fn read_all(pids: &[u32]) -> std::io::Result<BTreeMap<u32, ThreadReading>> {
    let mut out = BTreeMap::new();
    for (i, &pid) in pids.iter().enumerate() {
        match read(pid) {
            Ok(m) => out.extend(m),
            Err(e) if i == 0 => return Err(e),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// On-CPU and run-queue time (ns) and timeslices of every thread of `pids`, without names:
/// a sampling tick's reading.
pub fn read_times(pids: &[u32]) -> BTreeMap<u32, (u64, u64, u64)> {
    let mut out = BTreeMap::new();
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(t) = std::fs::read_to_string(e.path().join("schedstat"))
                .ok()
                .as_deref()
                .and_then(parse)
            {
                out.insert(tid, t);
            }
        }
    }
    out
}

/// The interval between two ticks' readings: the threads present at both.
pub fn sample(
    a: &BTreeMap<u32, (u64, u64, u64)>,
    b: &BTreeMap<u32, (u64, u64, u64)>,
    start_unix_us: u64,
    end_unix_us: u64,
) -> SchedSample {
    let mut s = SchedSample {
        start_unix_us,
        end_unix_us,
        ..SchedSample::default()
    };
    for (tid, (run, wait, slices)) in b {
        let Some((r0, w0, n0)) = a.get(tid) else {
            continue;
        };
        let (dr, dw) = (run.saturating_sub(*r0), wait.saturating_sub(*w0));
        s.run_us += dr / 1000;
        s.wait_us += dw / 1000;
        s.timeslices += slices.saturating_sub(*n0);
        if dr + dw > 0 {
            s.active += 1;
        }
    }
    s
}

/// The window's accounting over the threads present at both ends.
pub fn delta(
    before: &BTreeMap<u32, ThreadReading>,
    after: &BTreeMap<u32, ThreadReading>,
) -> ThreadSched {
    let (mut run, mut wait, mut slices, mut n) = (0u64, 0u64, 0u64, 0u32);
    let mut worst: Option<ThreadWait> = None;
    for (tid, a) in after {
        let Some(b) = before.get(tid) else { continue };
        n += 1;
        let w = a.wait_ns.saturating_sub(b.wait_ns);
        run += a.run_ns.saturating_sub(b.run_ns);
        wait += w;
        slices += a.slices.saturating_sub(b.slices);
        if worst.as_ref().is_none_or(|x| w / 1000 > x.wait_us) {
            worst = Some(ThreadWait {
                tid: *tid,
                name: a.name.clone(),
                wait_us: w / 1000,
            });
        }
    }
    ThreadSched {
        threads: n,
        run_us: run / 1000,
        wait_us: wait / 1000,
        wait_share: if run + wait == 0 {
            0.0
        } else {
            wait as f64 / (run + wait) as f64
        },
        timeslices: slices,
        worst: worst.filter(|w| w.wait_us > 0),
        timeline: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_threads_present_at_both_ends() {
        assert_eq!(parse("1000 2000 3\n"), Some((1000, 2000, 3)));
        let t = |run, wait, slices| ThreadReading {
            name: "w".into(),
            run_ns: run,
            wait_ns: wait,
            slices,
        };
        let before = BTreeMap::from([(1, t(0, 0, 0)), (2, t(0, 0, 0))]);
        let after = BTreeMap::from([
            (1, t(3_000_000, 1_000_000, 5)),
            (2, t(1_000_000, 3_000_000, 2)),
            (3, t(9_000_000, 9_000_000, 9)),
        ]);
        let d = delta(&before, &after);
        assert_eq!(
            (d.threads, d.run_us, d.wait_us, d.timeslices),
            (2, 4000, 4000, 7)
        );
        assert!((d.wait_share - 0.5).abs() < 1e-9);
        assert_eq!(d.worst.unwrap().tid, 2);
    }

    #[test]
    fn a_sample_counts_the_threads_that_ran_or_waited() {
        let a = BTreeMap::from([(1, (0, 0, 0)), (2, (5_000, 5_000, 7)), (3, (0, 0, 1))]);
        let b = BTreeMap::from([
            (1, (2_000_000, 6_000_000, 3)),
            (2, (5_000, 5_000, 7)),
            (3, (1_000_000, 0, 2)),
            (4, (9_000_000, 9_000_000, 50)),
        ]);
        let s = sample(&a, &b, 10, 20);
        assert_eq!((s.run_us, s.wait_us, s.active), (3000, 6000, 2));
        // The timeslices of the threads present at both ticks.
        assert_eq!(s.timeslices, 4);
        assert_eq!((s.start_unix_us, s.end_unix_us), (10, 20));
    }

    #[test]
    fn reads_this_process() {
        let r = read(std::process::id()).unwrap();
        assert!(!r.is_empty());
    }
}
