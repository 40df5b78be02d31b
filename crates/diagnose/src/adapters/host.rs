//! Layer 5: the server host's kernel evidence over the c=N run, from `lagtrace-host`.
//!
//! The server's process is the one holding the listener on the target port in the namespace
//! that owns the target address (sock_diag inode → `/proc/*/fd`), unless the user named it
//! (`--server-pid`). Its cgroup throttling is sampled through the window so the rules can
//! place the throttled periods next to the slow requests.

use std::time::Duration;

use lagtrace_host::{HostError, HostOptions};
use lagtrace_model::host::HostReport;
use lagtrace_netns::NetNs;
use lagtrace_sockets::serving::Dest;

use crate::evidence::Layer;
use crate::run::ServerLocation;

/// How often the listen queues and the cgroup's throttling counters are read.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// The listen socket state number (sock_diag).
const TCP_LISTEN: u32 = 10;

/// The processes holding the listener on `port` in `netns` that serves `dest` (the rule the
/// sockets layer follows too, [`lagtrace_sockets::serving`]), lowest pid first.
pub fn listener_pids(netns: &NetNs, dest: Dest, port: u16) -> std::io::Result<Vec<u32>> {
    let socks = netns.run(|| lagtrace_sockets::diag::dump_tcp(1 << TCP_LISTEN))??;
    let inodes: Vec<u64> = lagtrace_sockets::serving::serving(&socks, |s| s.local, port, dest)
        .into_iter()
        .filter(|s| s.inode != 0)
        .map(|s| s.inode)
        .collect();
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    let scan = lagtrace_sockets::procfs::scan_fds(&lagtrace_sockets::procfs::pids());
    let mut pids: Vec<u32> = inodes
        .iter()
        .filter_map(|i| scan.owners.get(i))
        .flatten()
        .map(|o| o.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Measures the server's host for `window`: its process (`pid`, else the owner of the
/// listener on `port` that serves `dest`) or, when no process can be found, its namespace only; `ipv6`: the server's
/// address is IPv6 (the rule walk reads the `ip6` tables).
pub fn measure(
    loc: &ServerLocation,
    dest: Dest,
    port: u16,
    ipv6: bool,
    pid: Option<u32>,
    window: Duration,
) -> Layer<HostReport> {
    let (netns, name) = match loc {
        ServerLocation::Here => (NetNs::Current, None),
        ServerLocation::Namespace(n) => (NetNs::Named(n.clone()), Some(n.clone())),
        ServerLocation::Unknown(e) if pid.is_none() => {
            return Layer::unavailable(format!(
                "cannot tell where the server runs: the namespaces under /run/netns cannot \
                 be entered ({e}); name it with --server-pid"
            ));
        }
        ServerLocation::Elsewhere if pid.is_none() => {
            return Layer::skipped(
                "the server is not on this machine (its address belongs to no namespace \
                 lagtrace can enter): its kernel counters, cgroup and queues cannot be read; \
                 name a local server with --server-pid",
            );
        }
        _ => (NetNs::Current, None),
    };
    // The highest pid of the listener's holders: a pre-forked server's workers (which
    // serve the requests) come after its master. Every holder's threads are accounted: any
    // worker may serve a request (one may take every connection while another idles).
    let holders = listener_pids(&netns, dest, port).unwrap_or_default();
    let found = match pid {
        Some(p) => Some(p),
        None => holders.last().copied(),
    };
    let more_pids = match pid {
        Some(p) if !holders.contains(&p) => Vec::new(),
        _ => holders,
    };
    let o = HostOptions {
        netns: if found.is_some() { None } else { name },
        pid: found,
        more_pids,
        duration: window,
        interval: INTERVAL,
        // The server's namespace's drops by device and reason (BPF); machine-wide counts
        // would be no evidence about this server: then none.
        drops: true,
        drops_machine: false,
        offcpu: true,
        // What the server's threads do on a CPU: the library and function a CPU-bound
        // server's time is in.
        profile_hz: lagtrace_host::oncpu::DEFAULT_HZ,
        softirq: true,
        port: Some(port),
        ipv6,
        // Read only when the kernel's receive cost per packet calls for an explanation.
        rule_walk: lagtrace_host::RuleWalk::IfCostly,
    };
    match lagtrace_host::measure(&o) {
        Ok(r) => {
            let mut l = Layer::ran(r);
            if found.is_none() {
                l.reason = Some(format!(
                    "no process holding a listener on :{port} could be read{}: namespace \
                     counters only (no cgroup or run-queue evidence)",
                    super::missing(lagtrace_model::Capability::SysPtrace)
                ));
            }
            l
        }
        Err(HostError::Privilege(p)) => Layer::unavailable(p.to_string()),
        Err(e) => Layer::error(e.to_string()),
    }
}
