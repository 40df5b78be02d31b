//! Who used the host's CPUs over the window: `/proc/stat` for all of them, `/proc/PID/stat`
//! (utime + stime) for each process. Tells a server starved by other work on its host from
//! one starved by the measurement itself (a load generator sharing the host).

use std::collections::BTreeMap;

use lagtrace_model::host::{HostCpu, ProcCpu};

/// Processes listed in [`HostCpu::top`].
const TOP: usize = 5;

/// One reading of the host and of every process.
#[derive(Debug, Clone, Default)]
pub struct CpuReading {
    /// CPUs online (`cpuN` lines).
    pub cpus: u32,
    /// Busy time of all CPUs, clock ticks (all but idle and iowait).
    pub busy_ticks: u64,
    /// Each process's name and CPU time, clock ticks.
    pub procs: BTreeMap<u32, (String, u64)>,
}

/// Parses `/proc/stat`: the CPUs online and the busy ticks of the `cpu` line.
pub fn parse_stat(text: &str) -> Option<(u32, u64)> {
    let mut cpus = 0u32;
    let mut busy = None;
    for l in text.lines() {
        let mut f = l.split_whitespace();
        match f.next() {
            Some("cpu") => {
                let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal (guest time is in user).
                let total: u64 = v.iter().take(8).sum();
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                busy = Some(total.saturating_sub(idle));
            }
            Some(c) if c.starts_with("cpu") => cpus += 1,
            _ => {}
        }
    }
    Some((cpus.max(1), busy?))
}

/// Parses `/proc/PID/stat`: the command name and utime + stime (ticks). The name is in
/// parentheses and may itself hold spaces or parentheses: the fields follow the last `)`.
pub fn parse_pid_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut f = text.get(close + 1..)?.split_whitespace();
    // After the name: state (3), ppid, pgrp, session, tty_nr, tpgid, flags, minflt,
    // cminflt, majflt, cmajflt, utime (14), stime (15).
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// Reads the host and every process now.
pub fn read() -> std::io::Result<CpuReading> {
    let (cpus, busy_ticks) = parse_stat(&std::fs::read_to_string("/proc/stat")?)
        .ok_or_else(|| std::io::Error::other("no cpu line in /proc/stat"))?;
    let mut procs = BTreeMap::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(p) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_pid_stat)
        {
            procs.insert(pid, p);
        }
    }
    Ok(CpuReading {
        cpus,
        busy_ticks,
        procs,
    })
}

/// Parses a CPU list such as `0-3,8,10-11` (`Cpus_allowed_list`).
pub fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            v.extend(a..=b.min(a.saturating_add(4096)));
        }
    }
    v
}

/// The CPUs process `pid` may run on; `None` when unreadable.
pub fn allowed_cpus(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(parse_cpu_list(l))
}

/// Whether `own` may run on a CPU one of `watched` may run on (true when unknown).
pub fn shares_cpus(own: u32, watched: &[u32]) -> bool {
    let Some(mine) = allowed_cpus(own) else {
        return true;
    };
    let theirs: Vec<Vec<u32>> = watched.iter().filter_map(|p| allowed_cpus(*p)).collect();
    theirs.is_empty() || theirs.iter().any(|t| t.iter().any(|c| mine.contains(c)))
}

/// Microseconds per clock tick (`_SC_CLK_TCK`, 100 Hz nearly everywhere).
fn tick_us() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1_000_000 / hz as u64
    } else {
        10_000
    }
}

/// CPU time (µs) between two readings of the processes whose name `which` accepts (a
/// process that started within the window counts from zero).
pub fn used_by(a: &CpuReading, b: &CpuReading, which: impl Fn(&str) -> bool) -> u64 {
    let ticks: u64 = b
        .procs
        .iter()
        .filter(|(_, (comm, _))| which(comm))
        .map(|(pid, (_, t))| t.saturating_sub(a.procs.get(pid).map_or(0, |p| p.1)))
        .sum();
    ticks * tick_us()
}

/// The window between two readings: `own` is the measuring process, `watched` the
/// server's processes. A process that started within the window counts from zero.
pub fn delta(a: &CpuReading, b: &CpuReading, own: u32, watched: &[u32], window_us: u64) -> HostCpu {
    let tick = tick_us();
    let used = |pid: &u32| {
        let after = b.procs.get(pid).map_or(0, |p| p.1);
        let before = a.procs.get(pid).map_or(0, |p| p.1);
        after.saturating_sub(before) * tick
    };
    let busy_us = b.busy_ticks.saturating_sub(a.busy_ticks) * tick;
    let own_us = used(&own);
    let watched_us: u64 = watched.iter().filter(|p| **p != own).map(used).sum();
    // Where the server ran: its processes that did a tenth of its work or more (an idle
    // nginx master with the default affinity says nothing about where its workers wait).
    let mut busy: Vec<u32> = watched
        .iter()
        .copied()
        .filter(|p| *p != own && used(p) * 10 >= watched_us.max(1))
        .collect();
    if busy.is_empty() {
        busy = watched.to_vec();
    }
    let mut top: Vec<ProcCpu> = b
        .procs
        .iter()
        .filter(|(pid, _)| **pid != own && !watched.contains(pid))
        .map(|(pid, (comm, _))| ProcCpu {
            pid: *pid,
            comm: comm.clone(),
            cpu_us: used(pid),
        })
        .filter(|p| p.cpu_us > 0)
        .collect();
    let others_us: u64 = top.iter().map(|p| p.cpu_us).sum();
    top.sort_by(|x, y| y.cpu_us.cmp(&x.cpu_us).then(x.pid.cmp(&y.pid)));
    top.truncate(TOP);
    HostCpu {
        cpus: b.cpus,
        busy_us,
        busy_share: busy_us as f64 / (u64::from(b.cpus) * window_us).max(1) as f64,
        own_us,
        watched_us,
        others_us,
        own_shares_cpus: shares_cpus(own, &busy),
        unattributed_us: busy_us.saturating_sub(own_us + watched_us + others_us),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_stat_files() {
        let stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n\
                    cpu1 50 3 25 500 10 2 1 0 0 0\nintr 1 2 3\n";
        assert_eq!(parse_stat(stat), Some((2, 160)));
        let p = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 70 30 0 0 20 0 1 0";
        assert_eq!(parse_pid_stat(p), Some(("my (odd) name".into(), 100)));
        assert_eq!(parse_pid_stat("garbage"), None);
    }

    #[test]
    fn splits_the_host_into_own_watched_and_others() {
        let r = |busy, procs: &[(u32, &str, u64)]| CpuReading {
            cpus: 2,
            busy_ticks: busy,
            procs: procs
                .iter()
                .map(|(p, c, t)| (*p, (c.to_string(), *t)))
                .collect(),
        };
        let a = r(
            1000,
            &[(1, "lagtrace", 10), (2, "nginx", 0), (3, "rustc", 5)],
        );
        let b = r(
            1300,
            &[
                (1, "lagtrace", 110),
                (2, "nginx", 40),
                (3, "rustc", 105),
                (4, "new", 20),
            ],
        );
        let tick = tick_us();
        let d = delta(&a, &b, 1, &[2], 3_000_000);
        assert_eq!(d.busy_us, 300 * tick);
        assert_eq!(d.own_us, 100 * tick);
        assert_eq!(d.watched_us, 40 * tick);
        assert_eq!(d.others_us, 120 * tick);
        assert_eq!(d.unattributed_us, 40 * tick);
        let top: Vec<(u32, u64)> = d.top.iter().map(|p| (p.pid, p.cpu_us)).collect();
        assert_eq!(top, vec![(3, 100 * tick), (4, 20 * tick)]);
    }

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("1"), vec![1]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        let me = std::process::id();
        assert!(shares_cpus(me, &[me]));
    }

    #[test]
    fn reads_this_host() {
        let r = read().unwrap();
        assert!(r.cpus >= 1);
        assert!(r.procs.contains_key(&std::process::id()));
    }
}
