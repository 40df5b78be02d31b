//! System plumbing: iproute2/tc/nft commands, processes, subnets.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lagtrace_model::{Capability, Privilege};

use crate::error::{Context, Result, bail};

use crate::ServerInfo;

/// Checks up front that this process may create namespaces and links: CAP_NET_ADMIN and
/// CAP_SYS_ADMIN in its effective set (root has both).
pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let missing: Vec<Capability> = [Capability::NetAdmin, Capability::SysAdmin]
        .into_iter()
        .filter(|c| eff & (1u64 << c.bit()) == 0)
        .collect();
    if !missing.is_empty() {
        return Err(Privilege {
            what: "the lab".into(),
            capabilities: missing,
            hint: " (run as root) to create and remove network namespaces, veth links and their \
                   servers; `lagtrace serve` on loopback works without"
                .into(),
        }
        .into());
    }
    Ok(())
}

/// Runs `prog args`; a failure carries its stderr.
pub fn run(prog: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        // Not in the terminal's foreground group: Ctrl-C must not kill a step half-way.
        .process_group(0)
        .output()
        .with_context(|| format!("running {prog} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `ip args`.
pub fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

fn output(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Turns IPv6 off on a lab interface so captures only see the lab's IPv4 traffic
/// (best effort). /proc/sys/net belongs to the namespace of the thread that opens it.
pub fn disable_ipv6(ns: Option<&str>, iface: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6");
    let netns = lagtrace_netns::NetNs::from_flag(ns);
    let _ = netns.run(move || fs::write(path, "1"));
}

fn parse_net(s: &str) -> Option<(u32, u8)> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, l.parse::<u8>().ok()?),
        None => (s, 32),
    };
    let a: Ipv4Addr = a.parse().ok()?;
    Some((u32::from(a), l.min(32)))
}

fn overlaps(a: (u32, u8), b: (u32, u8)) -> bool {
    let l = a.1.min(b.1);
    let mask = if l == 0 { 0 } else { u32::MAX << (32 - l) };
    a.0 & mask == b.0 & mask
}

/// IPv4 networks in use on this machine: addresses and routes of all tables (the default
/// route is not counted).
fn used_nets() -> Vec<(u32, u8)> {
    let mut nets = Vec::new();
    for line in output("ip", &["-4", "-o", "addr", "show"]).lines() {
        let mut it = line.split_whitespace();
        while let Some(w) = it.next() {
            if w == "inet"
                && let Some(n) = it.next().and_then(parse_net)
            {
                nets.push(n);
            }
        }
    }
    for line in output("ip", &["-4", "route", "show", "table", "all"]).lines() {
        let mut words = line.split_whitespace();
        let mut first = words.next().unwrap_or("");
        if matches!(
            first,
            "local" | "broadcast" | "unicast" | "blackhole" | "unreachable" | "prohibit" | "throw"
        ) {
            first = words.next().unwrap_or("");
        }
        if let Some(n) = parse_net(first) {
            nets.push(n);
        }
    }
    nets
}

/// Picks a free /30 in 10.0.0.0/8 from the name's hash: (client .1, server .2). Probes the
/// next /30 while the chosen one overlaps an address or route of this machine.
pub fn pick_subnet(hash: u64) -> Result<(Ipv4Addr, Ipv4Addr)> {
    pick_from(hash, &used_nets())
}

fn pick_from(hash: u64, used: &[(u32, u8)]) -> Result<(Ipv4Addr, Ipv4Addr)> {
    // 10.64.0.0 .. 10.255.255.252: keep clear of the low 10.x ranges people often use.
    let first = u32::from(Ipv4Addr::new(10, 64, 0, 0));
    let slots: u32 = (192 << 16) / 4; // the /30s of 10.64.0.0 - 10.255.255.255
    let mut slot = (hash % u64::from(slots)) as u32;
    let mut walked: u64 = 0;
    while walked <= u64::from(slots) {
        let base = first + slot * 4;
        match used.iter().find(|&&u| overlaps(u, (base, 30))) {
            None => return Ok((Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))),
            Some(&(net, len)) => {
                // Jump past the whole network in use (a /16 route is 16384 slots).
                let size: u64 = 1u64 << (32 - u32::from(len.max(30)));
                let end = u64::from(net & !((size - 1) as u32)) + size;
                let next = end.saturating_sub(u64::from(first)) / 4;
                let step = (next.max(u64::from(slot) + 1)) - u64::from(slot);
                walked += step;
                slot = ((u64::from(slot) + step) % u64::from(slots)) as u32;
            }
        }
    }
    bail!(
        "no free /30 subnet found in 10.64.0.0-10.255.255.255 (all covered by addresses or routes)"
    )
}

/// Whether a link with that name exists in the current namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: i32) -> Result<()> {
    let pid = i32::try_from(pid).context("pid out of range")?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(std::io::Error::last_os_error()).context("kill");
    }
    Ok(())
}

/// Whether `pid` runs (zombies count as gone).
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// SIGTERM, then SIGKILL after `wait`.
pub fn kill_wait(pid: u32, wait: Duration) {
    let _ = signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + wait;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        let _ = signal(pid, libc::SIGKILL);
    }
}

/// The net namespace inode of a process.
pub fn pid_netns_inode(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino())
}

/// Processes in the named namespace (`ip netns pids`).
pub fn netns_pids(ns: &str) -> Vec<u32> {
    output("ip", &["netns", "pids", ns])
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| p != std::process::id())
        .collect()
}

/// Children of `pid` (nginx workers of a master).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) {
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
                if ppid == Some(pid) && alive(p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// After a SIGHUP: waits until the master has new workers and the old ones are gone.
pub fn wait_reload(master: u32, before: &[u32], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let now = children(master);
        let fresh = now.iter().any(|p| !before.contains(p));
        let old_left = now.iter().any(|p| before.contains(p));
        if fresh && !old_left {
            return Ok(());
        }
        if !alive(master) {
            bail!("nginx master {master} exited");
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for new workers");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `n` lines of a log, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    match fs::read_to_string(path) {
        Ok(s) => {
            let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
            let from = lines.len().saturating_sub(n);
            format!(
                "last lines of {}: {}",
                path.display(),
                lines[from..].join(" | ")
            )
        }
        Err(_) => format!("{} is empty", path.display()),
    }
}

/// Polls until a TCP connect to `addr` succeeds.
pub fn wait_answer(addr: SocketAddr, limit: Duration, pid: Option<u32>) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(p) = pid.filter(|&p| !alive(p)) {
            bail!("process {p} exited");
        }
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e).context(format!("connecting to {addr}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Starts `ip netns exec NS EXE ARGS` in its own session with output to `log`, and
/// returns its pid (the exec keeps it).
pub fn spawn_detached(ns: &str, exe: &Path, args: &[String], log: &Path) -> Result<u32> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("creating {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("duplicating the descriptor of {}", log.display()))?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("spawning ip netns exec")?;
    // The child is not waited for: it outlives this process. Reap it in the background
    // when it exits before we do.
    let pid = child.id();
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(pid)
}

/// The executable recorded for a `builtin-process` server.
pub fn exe_of_state(info: &ServerInfo) -> Option<std::path::PathBuf> {
    info.config.clone().filter(|p| p.exists())
}

/// Deletes the `netdev` table `table` in the current namespace if it exists.
pub fn delete_nft_table(table: &str) {
    if Command::new("nft")
        .args(["list", "table", "netdev", table])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        let _ = run("nft", &["delete", "table", "netdev", table]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_in_use_are_skipped() {
        let (c, s) = pick_from(7, &[]).expect("free");
        assert_eq!(u32::from(s), u32::from(c) + 1);
        assert_eq!(u32::from(c) % 4, 1, "client is .1 of a /30");
        // The same /30 taken by an address, then by a covering route: the next one is used.
        let base = u32::from(c) - 1;
        let (c2, _) = pick_from(7, &[(base + 1, 32)]).expect("free");
        assert_eq!(u32::from(c2), base + 5);
        let (c3, _) = pick_from(7, &[(base & 0xffff_0000, 16)]).expect("free");
        assert_eq!(
            u32::from(c3),
            (base & 0xffff_0000) + 0x1_0000 + 1,
            "first /30 after the /16"
        );
        // Everything covered: an error, not a loop.
        assert!(pick_from(7, &[(0x0a00_0000, 8)]).is_err());
        // Wraps around the end of the range.
        let last = 0x0aff_fffc;
        let (c4, _) = pick_from(u64::from((last - 0x0a40_0000) / 4), &[(last, 30)]).expect("wrap");
        assert_eq!(u32::from(c4), 0x0a40_0001);
    }

    #[test]
    fn networks_parse() {
        assert_eq!(parse_net("10.1.2.3/24"), Some((0x0a01_0203, 24)));
        assert_eq!(parse_net("10.1.2.3"), Some((0x0a01_0203, 32)));
        assert_eq!(parse_net("default"), None);
        assert!(overlaps((0x0a00_0000, 8), (0x0a40_0004, 30)));
        assert!(!overlaps((0xc0a8_0000, 16), (0x0a40_0004, 30)));
    }
}
