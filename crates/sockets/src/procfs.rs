//! What /proc tells: which processes hold which socket inodes, and the delayed-ACK state
//! columns of /proc/net/tcp{,6} that sock_diag does not carry.

use std::collections::HashMap;
use std::fs;
use std::io;

use serde::{Deserialize, Serialize};

/// A process holding a socket through one of its descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Owner {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/PID/comm`).
    pub comm: String,
    /// Descriptor number in that process.
    pub fd: i32,
}

/// Result of scanning /proc/*/fd.
#[derive(Debug, Default)]
pub struct FdScan {
    /// Socket inode → the descriptors that hold it.
    pub owners: HashMap<u64, Vec<Owner>>,
    /// Processes whose descriptors could not be listed, with the error.
    pub unreadable: Vec<(u32, String, io::ErrorKind)>,
    /// Processes that exited while they were being scanned.
    pub vanished: Vec<u32>,
}

/// The command name of a process, if it still exists.
pub fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The parent pid of a process.
pub fn ppid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: the fields after the last ')' are fixed.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The arguments of a process, as NUL-separated in /proc/PID/cmdline.
/// When the process started (wall clock), from its `starttime` (clock ticks after boot) and
/// the boot time in /proc/stat. `None` if unreadable.
pub fn start_time(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the comm, which may hold spaces: state is field 3, starttime field 22.
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    let secs = btime.checked_add(ticks / hz)?;
    let nanos = (ticks % hz) * 1_000_000_000 / hz;
    Some(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos as u32))
}

pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// Every running process id.
pub fn pids() -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut v: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

fn socket_inode(link: &std::path::Path) -> Option<u64> {
    let s = link.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Scans the descriptors of `pids` for sockets.
pub fn scan_fds(pids: &[u32]) -> FdScan {
    let mut scan = FdScan::default();
    for &pid in pids {
        let rd = match fs::read_dir(format!("/proc/{pid}/fd")) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                scan.vanished.push(pid);
                continue;
            }
            Err(e) => {
                let c = comm(pid).unwrap_or_else(|| "?".into());
                scan.unreadable.push((pid, c, e.kind()));
                continue;
            }
        };
        let mut comm_name: Option<String> = None;
        let mut denied = None;
        for entry in rd.filter_map(|e| e.ok()) {
            // Listing /proc/PID/fd needs only DAC rights; readlink needs ptrace read access.
            let link = match fs::read_link(entry.path()) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    denied = Some(e.kind());
                    break;
                }
                Err(_) => continue, // closed meanwhile
            };
            let Some(inode) = socket_inode(&link) else {
                continue;
            };
            let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let c = comm_name
                .get_or_insert_with(|| comm(pid).unwrap_or_else(|| "?".into()))
                .clone();
            scan.owners
                .entry(inode)
                .or_default()
                .push(Owner { pid, comm: c, fd });
        }
        if let Some(kind) = denied {
            let c = comm(pid).unwrap_or_else(|| "?".into());
            scan.unreadable.push((pid, c, kind));
        }
    }
    scan
}

/// The delayed-ACK state the kernel prints in /proc/net/tcp: column 15 is
/// `(icsk_ack.quick << 1) | inet_csk_in_pingpong_mode(sk)` (see `get_tcp4_sock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AckState {
    /// Quick ACKs left before delayed ACK resumes (0: delayed ACK in force).
    pub quick: u32,
    /// Interactive ("pingpong") mode: ACKs wait to ride on the reply, i.e. delayed.
    pub pingpong: bool,
}

/// Parses /proc/net/tcp or tcp6 text into inode → ack state. Listening sockets are
/// included; time-wait and request sockets (inode 0, other line format) are skipped.
pub fn parse_proc_net_tcp(text: &str) -> HashMap<u64, AckState> {
    let mut m = HashMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 15 {
            continue;
        }
        let Ok(inode) = f[9].parse::<u64>() else {
            continue;
        };
        if inode == 0 {
            continue;
        }
        let Ok(v) = f[14].parse::<u32>() else {
            continue;
        };
        m.insert(
            inode,
            AckState {
                quick: v >> 1,
                pingpong: v & 1 == 1,
            },
        );
    }
    m
}

/// Reads the ack state of every TCP socket in the calling *thread's* namespace
/// (`/proc/thread-self/net`: `/proc/net` follows the process, not the thread).
pub fn ack_states() -> io::Result<HashMap<u64, AckState>> {
    let mut m = parse_proc_net_tcp(&fs::read_to_string("/proc/thread-self/net/tcp")?);
    if let Ok(t6) = fs::read_to_string("/proc/thread-self/net/tcp6") {
        m.extend(parse_proc_net_tcp(&t6));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_columns() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1526 1 00000000a0835614 100 0 0 10 0\n   1: 0100007F:1F90 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000    33        0 4242 1 0000000011111111 20 4 17 10 -1\n   2: 020200C0:E4A0 507100CB:0050 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000082dc3e7d\n";
        let m = parse_proc_net_tcp(text);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[&1526],
            AckState {
                quick: 0,
                pingpong: false
            }
        );
        assert_eq!(
            m[&4242],
            AckState {
                quick: 8,
                pingpong: true
            }
        );
    }

    #[test]
    fn own_process_is_scanned() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let scan = scan_fds(&[std::process::id()]);
        use std::os::fd::AsRawFd;
        let fd = l.as_raw_fd();
        assert!(
            scan.owners.values().flatten().any(|o| o.fd == fd),
            "{scan:?}"
        );
        assert!(ppid(std::process::id()).is_some());
    }
}
