//! A process's cgroup CPU bandwidth accounting: cgroup v1 (`cpu` controller: `cpu.stat`,
//! `cpu.cfs_quota_us`, `cpu.cfs_period_us`; `cpuacct.usage`) or v2 (`cpu.stat`, `cpu.max`),
//! whichever holds the process's `cpu` controller.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lagtrace_model::host::{CgroupCpu, ThrottleSample};

/// Where a process's CPU accounting lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDirs {
    /// 1 or 2.
    pub version: u8,
    /// The directory with `cpu.stat`.
    pub cpu: PathBuf,
    /// v1: the `cpuacct` directory, when mounted separately or together.
    pub cpuacct: Option<PathBuf>,
}

/// One reading of a cgroup's CPU files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuReading {
    /// `nr_periods`.
    pub periods: u64,
    /// `nr_throttled`.
    pub throttled: u64,
    /// Throttled time, µs.
    pub throttled_us: u64,
    /// Usage, µs.
    pub usage_us: Option<u64>,
    /// Quota per period, µs (None: unlimited).
    pub quota_us: Option<u64>,
    /// Period, µs.
    pub period_us: Option<u64>,
    /// Whether the file had bandwidth fields at all (v2 without the cpu controller has not).
    pub has_bandwidth: bool,
}

/// `key value` lines.
pub fn parse_kv(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(char::is_whitespace)?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// One mount of `/proc/self/mountinfo`: (mount root, mount point, fstype, super options).
fn mounts(text: &str) -> Vec<(String, String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some((
                pre.get(3)?.to_string(),
                pre.get(4)?.to_string(),
                post.first()?.to_string(),
                post.get(2).unwrap_or(&"").to_string(),
            ))
        })
        .collect()
}

fn join_under(mount_root: &str, mount_point: &str, path: &str) -> PathBuf {
    let rel = path.strip_prefix(mount_root).unwrap_or(path);
    let rel = rel.trim_matches('/');
    if rel.is_empty() {
        return PathBuf::from(mount_point);
    }
    Path::new(mount_point).join(rel)
}

/// Finds a process's cpu cgroup from its `/proc/PID/cgroup` and this process's
/// `/proc/self/mountinfo` texts: the v1 hierarchy that has `cpu`, else the v2 one.
pub fn locate(proc_cgroup: &str, mountinfo: &str) -> Option<CgroupDirs> {
    let mounts = mounts(mountinfo);
    let v1_dir = |ctrl: &str| -> Option<(String, PathBuf)> {
        let path = proc_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls.split(',').any(|c| c == ctrl).then_some(path)
        })?;
        let (root, point, _, _) = mounts
            .iter()
            .find(|(_, _, fs, opts)| fs == "cgroup" && opts.split(',').any(|o| o == ctrl))?;
        Some((path.to_string(), join_under(root, point, path)))
    };
    if let Some((path, cpu)) = v1_dir("cpu") {
        // A separate cpuacct hierarchy counts for this cgroup only where the process sits
        // at the same path there (else its usage is another group's, often the root's).
        let cpuacct = v1_dir("cpuacct")
            .filter(|(p, _)| *p == path)
            .map(|(_, d)| d);
        return Some(CgroupDirs {
            version: 1,
            cpu,
            cpuacct,
        });
    }
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (root, point, _, _) = mounts.iter().find(|(_, _, fs, _)| fs == "cgroup2")?;
    Some(CgroupDirs {
        version: 2,
        cpu: join_under(root, point, path),
        cpuacct: None,
    })
}

/// A process's cgroup directory for the v1 controller `ctrl` (`blkio`) when a v1 hierarchy
/// holds it, else its v2 directory: (the hierarchy's mount point, the directory).
pub fn locate_controller(
    proc_cgroup: &str,
    mountinfo: &str,
    ctrl: &str,
) -> Option<(PathBuf, PathBuf)> {
    let mounts = mounts(mountinfo);
    let v1 = proc_cgroup
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls.split(',').any(|c| c == ctrl).then_some(path)
        })
        .and_then(|path| {
            let (root, point, _, _) = mounts
                .iter()
                .find(|(_, _, fs, opts)| fs == "cgroup" && opts.split(',').any(|o| o == ctrl))?;
            Some((PathBuf::from(point), join_under(root, point, path)))
        });
    if v1.is_some() {
        return v1;
    }
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (root, point, _, _) = mounts.iter().find(|(_, _, fs, _)| fs == "cgroup2")?;
    Some((PathBuf::from(point), join_under(root, point, path)))
}

/// Reads the CPU files of `dirs`.
pub fn read(dirs: &CgroupDirs) -> std::io::Result<CpuReading> {
    let stat = parse_kv(&std::fs::read_to_string(dirs.cpu.join("cpu.stat"))?);
    let file = |p: &Path| std::fs::read_to_string(p).ok();
    let mut r = CpuReading {
        periods: stat.get("nr_periods").copied().unwrap_or(0),
        throttled: stat.get("nr_throttled").copied().unwrap_or(0),
        has_bandwidth: stat.contains_key("nr_periods"),
        ..CpuReading::default()
    };
    if dirs.version == 1 {
        r.throttled_us = stat.get("throttled_time").copied().unwrap_or(0) / 1000;
        let num =
            |name: &str| file(&dirs.cpu.join(name)).and_then(|t| t.trim().parse::<i64>().ok());
        r.quota_us = num("cpu.cfs_quota_us").and_then(|q| u64::try_from(q).ok());
        r.period_us = num("cpu.cfs_period_us").and_then(|q| u64::try_from(q).ok());
        r.usage_us = dirs
            .cpuacct
            .as_ref()
            .and_then(|d| file(&d.join("cpuacct.usage")))
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map(|ns| ns / 1000);
    } else {
        r.throttled_us = stat.get("throttled_usec").copied().unwrap_or(0);
        r.usage_us = stat.get("usage_usec").copied();
        if let Some(max) = file(&dirs.cpu.join("cpu.max")) {
            let mut f = max.split_whitespace();
            r.quota_us = f.next().and_then(|q| q.parse().ok());
            r.period_us = f.next().and_then(|p| p.parse().ok());
        }
    }
    Ok(r)
}

/// The window's accounting from two readings.
pub fn delta(dirs: &CgroupDirs, before: &CpuReading, after: &CpuReading) -> CgroupCpu {
    let periods = after.periods.saturating_sub(before.periods);
    let throttled = after.throttled.saturating_sub(before.throttled);
    CgroupCpu {
        version: dirs.version,
        path: dirs.cpu.display().to_string(),
        quota_us: after.quota_us,
        period_us: after.period_us,
        periods,
        throttled_periods: throttled,
        throttled_us: after.throttled_us.saturating_sub(before.throttled_us),
        throttled_share: if periods == 0 {
            0.0
        } else {
            throttled as f64 / periods as f64
        },
        usage_us: after
            .usage_us
            .zip(before.usage_us)
            .map(|(a, b)| a.saturating_sub(b)),
        timeline: Vec::new(),
    }
}

/// The throttling counters of timed readings (`(t_unix_us, reading)`), relative to `first`.
pub fn timeline(first: &CpuReading, readings: &[(u64, CpuReading)]) -> Vec<ThrottleSample> {
    readings
        .iter()
        .map(|(t, r)| ThrottleSample {
            t_unix_us: *t,
            throttled_periods: r.throttled.saturating_sub(first.throttled),
            throttled_us: r.throttled_us.saturating_sub(first.throttled_us),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
36 25 0:31 / /sys/fs/cgroup/cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpuacct
44 25 0:39 / /sys/fs/cgroup/unified rw,relatime shared:18 - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_v1_cpu_hierarchy_then_v2() {
        let d = locate("2:cpuacct:/\n1:cpu:/a/b\n", MOUNTINFO).unwrap();
        assert_eq!(d.cpuacct, None, "the root's usage is not this group's");
        let d = locate("2:cpuacct:/a/b\n1:cpu:/a/b\n0::/u\n", MOUNTINFO).unwrap();
        assert_eq!(d.version, 1);
        assert_eq!(d.cpu, Path::new("/sys/fs/cgroup/cpu/a/b"));
        assert_eq!(
            d.cpuacct.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct/a/b"))
        );
        let d = locate("0::/svc.slice/x.service\n", MOUNTINFO).unwrap();
        assert_eq!(d.version, 2);
        assert_eq!(
            d.cpu,
            Path::new("/sys/fs/cgroup/unified/svc.slice/x.service")
        );
        let combined =
            "30 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let d = locate("3:cpu,cpuacct:/k\n", combined).unwrap();
        assert_eq!(d.cpu, d.cpuacct.unwrap());
        assert!(locate("1:memory:/x\n", "").is_none());
    }
}

#[cfg(test)]
mod v2_fixtures {
    use super::*;

    fn dir(name: &str) -> CgroupDirs {
        CgroupDirs {
            version: 2,
            cpu: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/host/cgroup-v2")
                .join(name),
            cpuacct: None,
        }
    }

    /// Two readings of a v2 group under `cpu.max 50000 100000` (the kernel's documented
    /// `cpu.stat` keys; this machine's v2 mount has no cpu controller to record from).
    #[test]
    fn v2_cpu_stat_and_cpu_max_give_the_windows_throttling() {
        let (a, b) = (dir("before"), dir("after"));
        let (ra, rb) = (read(&a).unwrap(), read(&b).unwrap());
        assert!(ra.has_bandwidth);
        let d = delta(&b, &ra, &rb);
        assert_eq!(
            (d.version, d.quota_us, d.period_us),
            (2, Some(50_000), Some(100_000))
        );
        assert_eq!((d.periods, d.throttled_periods), (100, 90));
        assert_eq!((d.throttled_us, d.usage_us), (7_200_000, Some(500_000)));
        assert!((d.throttled_share - 0.9).abs() < 1e-9);
    }

    /// A v2 group without the cpu controller: usage only, no bandwidth fields, no quota.
    #[test]
    fn v2_without_the_cpu_controller_has_usage_only() {
        let r = read(&dir("nocpu")).unwrap();
        assert!(!r.has_bandwidth);
        assert_eq!((r.usage_us, r.quota_us, r.periods), (Some(5000), None, 0));
    }
}
