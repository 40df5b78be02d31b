//! The block devices' work over the window (`/proc/diskstats`, as iostat reads it) and the
//! I/O limits of the watched process's cgroup (v1 `blkio.throttle.*_device`, v2 `io.max`,
//! its own and its ancestors'): which device a disk wait was on, how long the device itself
//! took per I/O, and whether a limit set the pace. A throttled read waits before it reaches
//! the device (the block layer holds the bio), so the device's own time per read stays
//! short while the reader blocks for the limit's interval — the two read together say
//! "throttled", where either alone does not.

use std::path::{Path, PathBuf};

use lagtrace_model::host::{DiskDelta, Disks, IoLimit};

/// One `/proc/diskstats` line's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskStat {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Kernel name (`sda`, `loop3`, `nvme0n1`).
    pub name: String,
    /// Reads completed.
    pub reads: u64,
    /// Time spent reading, ms (summed over reads in flight).
    pub read_ms: u64,
    /// Writes completed.
    pub writes: u64,
    /// Time spent writing, ms.
    pub write_ms: u64,
    /// Time the device had I/O in flight, ms.
    pub busy_ms: u64,
}

/// `/proc/diskstats`'s devices (fields 1–3 and 4, 7, 8, 11, 13 of each line).
pub fn parse(text: &str) -> Vec<DiskStat> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            Some(DiskStat {
                major: u32::try_from(n(0)?).ok()?,
                minor: u32::try_from(n(1)?).ok()?,
                name: f.get(2)?.to_string(),
                reads: n(3)?,
                read_ms: n(6)?,
                writes: n(7)?,
                write_ms: n(10)?,
                busy_ms: n(12)?,
            })
        })
        .collect()
}

/// `/proc/diskstats` now.
pub fn read() -> std::io::Result<Vec<DiskStat>> {
    std::fs::read_to_string("/proc/diskstats").map(|t| parse(&t))
}

/// The devices that completed I/O between `a` and `b`, most I/Os first.
pub fn deltas(a: &[DiskStat], b: &[DiskStat]) -> Vec<DiskDelta> {
    let mut v: Vec<DiskDelta> = b
        .iter()
        .filter_map(|y| {
            let x = a
                .iter()
                .find(|x| x.major == y.major && x.minor == y.minor)?;
            let reads = y.reads.saturating_sub(x.reads);
            let writes = y.writes.saturating_sub(x.writes);
            (reads + writes > 0).then(|| DiskDelta {
                device: y.name.clone(),
                dev: format!("{}:{}", y.major, y.minor),
                reads,
                writes,
                read_us: y.read_ms.saturating_sub(x.read_ms) * 1000,
                write_us: y.write_ms.saturating_sub(x.write_ms) * 1000,
                busy_us: y.busy_ms.saturating_sub(x.busy_ms) * 1000,
            })
        })
        .collect();
    v.sort_by(|p, q| {
        (q.reads + q.writes)
            .cmp(&(p.reads + p.writes))
            .then(p.dev.cmp(&q.dev))
    });
    v
}

/// The limits in one cgroup directory: v1 `blkio.throttle.{read,write}_{iops,bps}_device`
/// ("MAJ:MIN VALUE" lines), v2 `io.max` ("MAJ:MIN rbps=max wbps=max riops=20 wiops=max").
pub fn limits_in(dir: &Path, read: impl Fn(&Path) -> Option<String>) -> Vec<IoLimit> {
    let mut v = Vec::new();
    let cgroup = dir.display().to_string();
    for (file, kind) in [
        ("blkio.throttle.read_iops_device", "read-iops"),
        ("blkio.throttle.write_iops_device", "write-iops"),
        ("blkio.throttle.read_bps_device", "read-bps"),
        ("blkio.throttle.write_bps_device", "write-bps"),
    ] {
        for l in read(&dir.join(file)).unwrap_or_default().lines() {
            let mut f = l.split_whitespace();
            if let (Some(dev), Some(Ok(value))) = (f.next(), f.next().map(str::parse::<u64>)) {
                v.push(IoLimit {
                    dev: dev.to_string(),
                    device: None,
                    limit: kind.to_string(),
                    value,
                    file: format!("{cgroup}/{file}"),
                });
            }
        }
    }
    for l in read(&dir.join("io.max")).unwrap_or_default().lines() {
        let mut f = l.split_whitespace();
        let Some(dev) = f.next() else { continue };
        for kv in f {
            let Some((k, val)) = kv.split_once('=') else {
                continue;
            };
            let kind = match k {
                "riops" => "read-iops",
                "wiops" => "write-iops",
                "rbps" => "read-bps",
                "wbps" => "write-bps",
                _ => continue,
            };
            if let Ok(value) = val.parse::<u64>() {
                v.push(IoLimit {
                    dev: dev.to_string(),
                    device: None,
                    limit: kind.to_string(),
                    value,
                    file: format!("{cgroup}/io.max"),
                });
            }
        }
    }
    v
}

/// The limits that apply to the process with `/proc/PID/cgroup` text `proc_cgroup`: its
/// cgroup's and every ancestor's up to the hierarchy's mount point (a parent's limit holds
/// its children too).
pub fn limits(
    proc_cgroup: &str,
    mountinfo: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Vec<IoLimit> {
    let Some((mount, dir)) = crate::cgroup::locate_controller(proc_cgroup, mountinfo, "blkio")
    else {
        return Vec::new();
    };
    let mut v = Vec::new();
    let mut d: Option<PathBuf> = Some(dir);
    while let Some(p) = d {
        v.extend(limits_in(&p, &read));
        if p == mount {
            break;
        }
        d = p
            .parent()
            .filter(|q| q.starts_with(&mount))
            .map(Path::to_path_buf);
    }
    v
}

/// The window's devices and the process's limits, each limit named by its device when one
/// of `devices` has its numbers.
pub fn report(a: &[DiskStat], b: &[DiskStat], mut limits: Vec<IoLimit>) -> Disks {
    for l in &mut limits {
        l.device = b
            .iter()
            .find(|d| format!("{}:{}", d.major, d.minor) == l.dev)
            .map(|d| d.name.clone());
    }
    Disks {
        devices: deltas(a, b),
        limits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "   7       3 loop3 10 0 80 5 0 0 0 0 0 4 5 0 0 0 0 0 0\n \
                     259       0 nvme0n1 1000 20 9000 800 50 3 700 90 0 1200 900 0 0 0 0 0 0\n";
    const B: &str = "   7       3 loop3 50 0 400 9 0 0 0 0 0 8 9 0 0 0 0 0 0\n \
                     259       0 nvme0n1 1000 20 9000 800 52 3 716 95 0 1203 905 0 0 0 0 0 0\n";

    #[test]
    fn the_window_s_devices_are_what_moved_most_io_first() {
        let d = deltas(&parse(A), &parse(B));
        assert_eq!(d.len(), 2);
        assert_eq!(
            (
                d[0].device.as_str(),
                d[0].dev.as_str(),
                d[0].reads,
                d[0].read_us
            ),
            ("loop3", "7:3", 40, 4000)
        );
        assert_eq!(
            (d[1].device.as_str(), d[1].writes, d[1].write_us),
            ("nvme0n1", 2, 5000)
        );
        assert_eq!(d[0].busy_us, 4000);
        assert!(deltas(&parse(A), &parse(A)).is_empty());
        assert!(parse("garbage\n7 3\n").is_empty());
    }

    #[test]
    fn limits_are_read_from_v1_and_v2_files_and_from_ancestors() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/blkio rw,nosuid - cgroup cgroup rw,blkio\n\
31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n";
        let files = |p: &Path| -> Option<String> {
            match p.to_str()? {
                "/sys/fs/cgroup/blkio/app/web/blkio.throttle.read_iops_device" => {
                    Some("7:3 20\n".into())
                }
                "/sys/fs/cgroup/blkio/app/blkio.throttle.write_bps_device" => {
                    Some("259:0 1048576\n".into())
                }
                "/sys/fs/cgroup/unified/svc/io.max" => {
                    Some("7:3 rbps=max wbps=max riops=50 wiops=max\n".into())
                }
                _ => None,
            }
        };
        let v1 = limits("7:blkio:/app/web\n0::/svc\n", mountinfo, files);
        let got: Vec<(&str, &str, u64)> = v1
            .iter()
            .map(|l| (l.dev.as_str(), l.limit.as_str(), l.value))
            .collect();
        assert_eq!(
            got,
            vec![("7:3", "read-iops", 20), ("259:0", "write-bps", 1_048_576)]
        );
        assert!(
            v1[0]
                .file
                .ends_with("app/web/blkio.throttle.read_iops_device")
        );
        // v2 only (no blkio hierarchy): io.max, `max` fields skipped.
        let v2 = limits("0::/svc\n", mountinfo, files);
        assert_eq!(v2.len(), 1);
        assert_eq!((v2[0].limit.as_str(), v2[0].value), ("read-iops", 50));
        let r = report(&parse(A), &parse(B), v2);
        assert_eq!(r.limits[0].device.as_deref(), Some("loop3"));
    }
}
