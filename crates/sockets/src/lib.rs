//! Layer 4 of lagtrace: how processes really configured their TCP sockets.
//!
//! - [`inspect`]: live TCP sockets (sock_diag + `struct tcp_info`), their owners (/proc/*/fd),
//!   the delayed-ACK state (/proc/net/tcp), the options only the owner can read (via
//!   `pidfd_getfd` + `getsockopt`, without stopping the process), per-process summaries and
//!   server configuration lenses (nginx).
//! - [`record()`] / [`record_pids()`]: log the socket calls of a command or of running
//!   processes strace-style (a BPF program on syscall tracepoints; seccomp + ptrace as the
//!   fallback for a command), with a summary of the options each socket was given.
//!
//! Engines return data; nothing here prints (except the recorder's live trace, which goes to
//! the writer the caller supplies).

pub mod diag;
pub mod lens;
pub mod netlink;
pub mod opts;
pub mod procfs;
pub mod record;
pub mod serving;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use lagtrace_netns::NetNs;
use serde::{Deserialize, Serialize};

pub use diag::{SkMemInfo, TcpInfo};
pub use lens::{ConfigFinding, ConfigLens};
pub use opts::SocketOptions;
pub use procfs::{AckState, Owner};
pub use record::{Hooks, Mechanism, RecordOptions, Recording, record, record_pids};

/// What to inspect.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    /// Namespace to look into (ignored when `all_netns`).
    pub netns: NetNs,
    /// Every namespace: those under /run/netns and those of running processes.
    pub all_netns: bool,
    /// Only sockets whose local or remote port is this.
    pub port: Option<u16>,
    /// Only sockets held by this process.
    pub pid: Option<u32>,
    /// Only sockets held by processes with this command name.
    pub process: Option<String>,
    /// Only these states (kernel numbers, see [`diag::TCP_STATES`]); `None`: every state but
    /// TIME-WAIT (which belongs to no process).
    pub states: Option<Vec<u8>>,
    /// Read the owner-only options through pidfd_getfd.
    pub read_options: bool,
    /// Run the server configuration lenses on the owners.
    pub config_lenses: bool,
}

impl Default for InspectOptions {
    fn default() -> Self {
        InspectOptions {
            netns: NetNs::Current,
            all_netns: false,
            port: None,
            pid: None,
            process: None,
            states: None,
            read_options: true,
            config_lenses: true,
        }
    }
}

/// One TCP socket with everything lagtrace could learn about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SocketInfo {
    /// Namespace label: "current", a /run/netns name, or "pid N".
    pub netns: String,
    /// State name (ESTABLISHED, LISTEN, ...).
    pub state: String,
    /// Local address.
    pub local: SocketAddr,
    /// Remote address.
    pub remote: SocketAddr,
    /// Socket inode.
    pub inode: u64,
    /// Owner uid.
    pub uid: u32,
    /// Receive queue (listen: accept-queue length).
    pub recv_q: u32,
    /// Send queue (listen: accept-queue limit).
    pub send_q: u32,
    /// Processes holding the socket (several for a socket shared by nginx's workers).
    pub owners: Vec<Owner>,
    /// `struct tcp_info` from sock_diag.
    pub tcp_info: Option<TcpInfo>,
    /// Congestion control algorithm.
    pub congestion: Option<String>,
    /// Socket memory.
    pub skmem: Option<SkMemInfo>,
    /// Delayed-ACK state from /proc/net/tcp.
    pub ack: Option<AckState>,
    /// Options read through pidfd_getfd (`None`: not read; see `options_error`).
    pub options: Option<SocketOptions>,
    /// Why `options` could not be read.
    pub options_error: Option<String>,
}

/// Per-process roll-up of its sockets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Listening sockets.
    pub listening: usize,
    /// Established sockets.
    pub established: usize,
    /// Local ports of its listeners, and of established sockets accepted on them.
    pub server_ports: Vec<u16>,
    /// Remote ports of its outgoing (client) established sockets.
    pub client_ports: Vec<u16>,
    /// Established sockets with TCP_NODELAY on / off / unread.
    pub nodelay_on: usize,
    /// See `nodelay_on`.
    pub nodelay_off: usize,
    /// See `nodelay_on`.
    pub nodelay_unknown: usize,
    /// Established sockets with TCP_CORK on.
    pub cork_on: usize,
    /// Established sockets in delayed-ACK (pingpong) mode now.
    pub pingpong: usize,
}

impl ProcessSummary {
    /// "nginx (pid 1234): 100 established sockets on :8080, TCP_NODELAY off on 100/100".
    pub fn line(&self) -> String {
        let mut s = format!("{} (pid {}): ", self.comm, self.pid);
        let ports = |v: &[u16]| {
            v.iter()
                .map(|p| format!(":{p}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        if self.established == 0 {
            s += &format!("{} listening", self.listening);
            if !self.server_ports.is_empty() {
                s += &format!(" on {}", ports(&self.server_ports));
            }
            return s;
        }
        s += &format!("{} established", self.established);
        if !self.server_ports.is_empty() {
            s += &format!(" on {}", ports(&self.server_ports));
        }
        if !self.client_ports.is_empty() {
            s += &format!(" to {}", ports(&self.client_ports));
        }
        if self.listening > 0 {
            s += &format!(", {} listening", self.listening);
        }
        let known = self.nodelay_on + self.nodelay_off;
        if self.established > 0 {
            // Say the state that is there: "off on 0/4" reads as a riddle for a client
            // that set it everywhere.
            if self.nodelay_off > 0 {
                s += &format!(
                    ", TCP_NODELAY off on {}/{}",
                    self.nodelay_off, self.established
                );
            } else if known > 0 {
                s += &format!(
                    ", TCP_NODELAY on for {}/{}",
                    self.nodelay_on, self.established
                );
            }
            if self.nodelay_unknown > 0 {
                s += &format!(", options unread on {}", self.nodelay_unknown);
            }
            if self.cork_on > 0 {
                s += &format!(", TCP_CORK on {}/{}", self.cork_on, self.established);
            }
            s += &format!(
                ", delayed-ACK (pingpong) mode on {}/{}",
                self.pingpong, self.established
            );
        }
        s
    }
}

/// The result of [`inspect`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Inspection {
    /// Sockets, sorted by namespace, state and local port.
    pub sockets: Vec<SocketInfo>,
    /// One line per owning process.
    pub processes: Vec<ProcessSummary>,
    /// Server configuration findings.
    pub configs: Vec<ConfigFinding>,
    /// What could not be read and why.
    pub notes: Vec<String>,
    /// Processes whose descriptors could not be read (their sockets show no owner).
    pub unreadable: Vec<Unreadable>,
}

/// A process lagtrace could not look into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Unreadable {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Why.
    pub reason: String,
}

/// Errors that stop an inspection altogether (partial failures are notes instead).
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The namespace cannot be opened or entered (entering needs CAP_SYS_ADMIN).
    #[error(transparent)]
    Netns(lagtrace_netns::Error),
    /// sock_diag refused the dump.
    #[error("sock_diag dump failed: {0}")]
    Diag(std::io::Error),
}

impl InspectError {
    /// The missing capability, when that is why the inspection could not run.
    pub fn privilege(&self) -> Option<&lagtrace_model::Privilege> {
        match self {
            InspectError::Netns(e) => e.privilege(),
            InspectError::Diag(_) => None,
        }
    }
}

fn netns_label(ns: &NetNs) -> String {
    match ns {
        NetNs::Current => "current".into(),
        NetNs::Named(n) => n.clone(),
        NetNs::Pid(p) => format!("pid {p}"),
        NetNs::Path(p) => p.display().to_string(),
    }
}

/// Namespaces to scan for `--all-netns`: ours, the named ones, then those of processes,
/// each once (by namespace inode).
pub fn all_namespaces() -> Vec<NetNs> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |ns: NetNs| {
        if let Ok(ino) = ns.inode()
            && seen.insert(ino)
        {
            out.push(ns);
        }
    };
    add(NetNs::Current);
    for n in lagtrace_netns::list_named() {
        add(NetNs::Named(n));
    }
    for p in procfs::pids() {
        add(NetNs::Pid(p));
    }
    out
}

/// One namespace's label, sockets and ACK states.
type NsSockets = (String, Vec<diag::DiagSocket>, HashMap<u64, AckState>);

type NsDump = (
    Vec<diag::DiagSocket>,
    HashMap<u64, AckState>,
    Option<String>,
);

fn dump_ns(ns: &NetNs, states: u32, port: Option<u16>) -> Result<NsDump, InspectError> {
    let r = ns
        .run(|| {
            let socks = match port {
                Some(p) => diag::dump_tcp_port(states, p)?,
                None => diag::dump_tcp(states)?,
            };
            let (acks, note) = match procfs::ack_states() {
                Ok(a) => (a, None),
                Err(e) => (
                    HashMap::new(),
                    Some(format!(
                        "/proc/net/tcp unreadable ({e}): no delayed-ACK state"
                    )),
                ),
            };
            Ok::<_, std::io::Error>((socks, acks, note))
        })
        .map_err(InspectError::Netns)?;
    r.map_err(InspectError::Diag)
}

/// Phase 1 of [`inspect`]: sockets and owners, no options. Exposed so tests can make a
/// process exit between the phases.
#[doc(hidden)]
pub fn inspect_sockets(o: &InspectOptions) -> Result<Inspection, InspectError> {
    let mut ins = Inspection::default();
    let states = match &o.states {
        Some(v) => v.iter().fold(0u32, |m, s| m | (1 << s)),
        None => 0xfff & !(1 << 6),
    };
    let namespaces = if o.all_netns {
        all_namespaces()
    } else {
        vec![o.netns.clone()]
    };
    let dumped = dump_namespaces(o, &namespaces, states, &mut ins.notes)?;
    if let Some(pid) = o.pid
        && procfs::comm(pid).is_none()
    {
        ins.notes.push(format!("pid {pid}: no such process"));
    }
    let scan = procfs::scan_fds(&procfs::pids());
    ins.unreadable = scan
        .unreadable
        .iter()
        .map(|(pid, comm, kind)| Unreadable {
            pid: *pid,
            comm: comm.clone(),
            reason: format!(
                "/proc/{pid}/fd: {kind}: needs ptrace read access (CAP_SYS_PTRACE, or the \
                 same uid and a dumpable process)"
            ),
        })
        .collect();
    for (label, socks, acks) in dumped {
        for s in socks {
            let owners = scan.owners.get(&s.inode).cloned().unwrap_or_default();
            if selected(o, &s, &owners) {
                ins.sockets.push(socket_info(&label, s, owners, &acks));
            }
        }
    }
    ownership_notes(o, &mut ins);
    ins.sockets.sort_by(|a, b| {
        (&a.netns, a.state != "LISTEN", a.local.port(), a.remote).cmp(&(
            &b.netns,
            b.state != "LISTEN",
            b.local.port(),
            b.remote,
        ))
    });
    Ok(ins)
}

/// One dump per namespace. With `--all-netns` a namespace that vanished mid-scan is a note.
fn dump_namespaces(
    o: &InspectOptions,
    namespaces: &[NetNs],
    states: u32,
    notes: &mut Vec<String>,
) -> Result<Vec<NsSockets>, InspectError> {
    let mut dumped = Vec::new();
    for ns in namespaces {
        match dump_ns(ns, states, o.port) {
            Ok((socks, acks, note)) => {
                if let Some(n) = note {
                    notes.push(format!("{}: {n}", netns_label(ns)));
                }
                dumped.push((netns_label(ns), socks, acks));
            }
            // With --all-netns a process may exit (taking its namespace) or a named
            // namespace be deleted mid-scan: the others are still worth reporting.
            Err(e) if o.all_netns && !matches!(ns, NetNs::Current) => {
                notes.push(format!("namespace of {} skipped: {e}", netns_label(ns)));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dumped)
}

/// Whether a socket passes the `--port`, `--pid` and `--process` filters.
fn selected(o: &InspectOptions, s: &diag::DiagSocket, owners: &[Owner]) -> bool {
    if let Some(p) = o.port
        && s.local.port() != p
        && s.remote.port() != p
    {
        return false;
    }
    if let Some(pid) = o.pid
        && !owners.iter().any(|w| w.pid == pid)
    {
        return false;
    }
    if let Some(name) = &o.process
        && !owners.iter().any(|w| &w.comm == name)
    {
        return false;
    }
    true
}

/// One dumped socket as listed, options not read yet.
fn socket_info(
    label: &str,
    s: diag::DiagSocket,
    owners: Vec<Owner>,
    acks: &HashMap<u64, AckState>,
) -> SocketInfo {
    SocketInfo {
        netns: label.to_string(),
        state: diag::TCP_STATES
            .get(s.state as usize)
            .copied()
            .unwrap_or("UNKNOWN")
            .to_string(),
        local: s.local,
        remote: s.remote,
        inode: s.inode,
        uid: s.uid,
        recv_q: s.recv_q,
        send_q: s.send_q,
        owners,
        tcp_info: s.tcp_info,
        congestion: s.congestion,
        skmem: s.skmem,
        ack: acks.get(&s.inode).copied(),
        options: None,
        options_error: None,
    }
}

/// Notes on sockets whose owners could not be identified (unreadable `/proc/PID/fd`).
fn ownership_notes(o: &InspectOptions, ins: &mut Inspection) {
    if let Some(pid) = o.pid
        && let Some(u) = ins.unreadable.iter().find(|u| u.pid == pid)
    {
        ins.notes.push(format!(
            "pid {pid} ({}): its sockets cannot be identified: {}",
            u.comm, u.reason
        ));
    }
    let orphans = ins
        .sockets
        .iter()
        .filter(|s| s.owners.is_empty() && s.inode != 0)
        .count();
    if orphans > 0 && !ins.unreadable.is_empty() {
        ins.notes.push(format!(
            "{orphans} listed socket{} no known owner: its holder may have exited meanwhile, \
             or be among the {} processes whose descriptors could not be read (needs CAP_SYS_PTRACE, or the same uid); states, addresses and \
             TCP_INFO are complete",
            if orphans == 1 { " has" } else { "s have" },
            ins.unreadable.len()
        ));
    }
}

/// Phase 2 of [`inspect`]: read owner-only options through pidfd_getfd.
#[doc(hidden)]
pub fn read_all_options(ins: &mut Inspection) {
    let mut pidfds: HashMap<u32, Result<opts::PidFd, opts::DupError>> = HashMap::new();
    // (pid, comm, reason) -> sockets affected
    let mut failures: BTreeMap<(u32, String, String), usize> = BTreeMap::new();
    for s in &mut ins.sockets {
        if s.owners.is_empty() {
            if s.inode != 0 {
                s.options_error = Some("no owner found".into());
            }
            continue;
        }
        let mut last_err = None;
        for w in &s.owners {
            let pfd = pidfds
                .entry(w.pid)
                .or_insert_with(|| opts::PidFd::open(w.pid));
            let res = match pfd {
                Ok(p) => p.getfd(w.fd),
                Err(e) => Err(e.clone()),
            };
            match res {
                Ok(dup) => {
                    if opts::fd_inode(&dup) != Some(s.inode) {
                        last_err = Some((w, "descriptor reused for another file".to_string()));
                        continue; // dup dropped (closed) here
                    }
                    s.options = Some(opts::read_options(std::os::fd::AsRawFd::as_raw_fd(&dup)));
                    drop(dup); // close our duplicate at once; never shutdown()
                    last_err = None;
                    break;
                }
                Err(e) => {
                    let why = match e {
                        opts::DupError::Gone => "process exited during the scan".to_string(),
                        opts::DupError::FdGone => "socket closed during the scan".to_string(),
                        opts::DupError::Permission => {
                            "pidfd_getfd refused: needs CAP_SYS_PTRACE (or the same uid)".into()
                        }
                        opts::DupError::Unsupported => {
                            "pidfd_getfd unsupported (Linux >= 5.6 needed)".into()
                        }
                        opts::DupError::Other(m) => format!("pidfd_getfd: {m}"),
                    };
                    last_err = Some((w, why));
                }
            }
        }
        if let Some((w, why)) = last_err {
            *failures
                .entry((w.pid, w.comm.clone(), why.clone()))
                .or_default() += 1;
            s.options_error = Some(why);
        }
    }
    for ((pid, comm, why), n) in failures {
        ins.notes.push(format!(
            "{comm} ({pid}): options of {n} sockets not read: {why}"
        ));
    }
    if ins.sockets.iter().any(|s| s.options.is_some()) {
        ins.notes.push(
            "TCP_QUICKACK read back is the socket's current ACK mode, not a setting: the kernel \
             leaves quick-ACK mode by itself"
                .into(),
        );
        ins.notes.push(
            "whether SO_SNDBUF/SO_RCVBUF autotuning is locked (SOCK_*BUF_LOCK) is exposed by no \
             kernel interface (sock_diag, getsockopt, /proc): not reported"
                .into(),
        );
    }
}

/// Phase 3: per-process summaries.
fn summarize(ins: &mut Inspection) {
    let mut by_pid: BTreeMap<u32, ProcessSummary> = BTreeMap::new();
    let mut listen_ports: HashMap<u32, BTreeSet<u16>> = HashMap::new();
    for s in &ins.sockets {
        if s.state == "LISTEN" {
            for w in &s.owners {
                listen_ports
                    .entry(w.pid)
                    .or_default()
                    .insert(s.local.port());
            }
        }
    }
    for s in &ins.sockets {
        let mut pids_seen = BTreeSet::new();
        for w in &s.owners {
            if !pids_seen.insert(w.pid) {
                continue;
            }
            let e = by_pid.entry(w.pid).or_insert_with(|| ProcessSummary {
                pid: w.pid,
                comm: w.comm.clone(),
                listening: 0,
                established: 0,
                server_ports: vec![],
                client_ports: vec![],
                nodelay_on: 0,
                nodelay_off: 0,
                nodelay_unknown: 0,
                cork_on: 0,
                pingpong: 0,
            });
            let lp = listen_ports.get(&w.pid);
            match s.state.as_str() {
                "LISTEN" => {
                    e.listening += 1;
                    e.server_ports.push(s.local.port());
                }
                "ESTABLISHED" => {
                    e.established += 1;
                    if lp.is_some_and(|l| l.contains(&s.local.port())) {
                        e.server_ports.push(s.local.port());
                    } else {
                        e.client_ports.push(s.remote.port());
                    }
                    match s.options.as_ref().and_then(|o| o.nodelay) {
                        Some(true) => e.nodelay_on += 1,
                        Some(false) => e.nodelay_off += 1,
                        None => e.nodelay_unknown += 1,
                    }
                    if s.options.as_ref().and_then(|o| o.cork) == Some(true) {
                        e.cork_on += 1;
                    }
                    if s.ack.is_some_and(|a| a.pingpong) {
                        e.pingpong += 1;
                    }
                }
                _ => {}
            }
        }
    }
    ins.processes = by_pid
        .into_values()
        .map(|mut p| {
            p.server_ports.sort_unstable();
            p.server_ports.dedup();
            p.client_ports.sort_unstable();
            p.client_ports.dedup();
            p
        })
        .collect();
}

/// Phase 4: configuration lenses on the owners.
fn run_lenses(ins: &mut Inspection) {
    let lenses = lens::lenses();
    let mut done = BTreeSet::new();
    for p in &ins.processes {
        for l in &lenses {
            if l.matches(p.pid, &p.comm) {
                let main = l.main_pid(p.pid);
                if done.insert((l.software(), main)) {
                    let r = l.inspect(main);
                    ins.configs.extend(r.findings);
                    ins.notes.extend(r.notes);
                }
            }
        }
    }
}

/// Inspects live TCP sockets. Partial failures (a process exiting mid-scan, missing
/// privileges) become notes; `Err` only when the namespace or sock_diag is unusable.
pub fn inspect(o: &InspectOptions) -> Result<Inspection, InspectError> {
    Ok(finish_inspection(inspect_sockets(o)?, o))
}

/// [`inspect`]'s phases after the socket listing (options, summaries, lenses), for tests
/// that interfere between phases.
#[doc(hidden)]
pub fn finish_inspection(mut ins: Inspection, o: &InspectOptions) -> Inspection {
    if o.read_options {
        read_all_options(&mut ins);
    }
    summarize(&mut ins);
    if o.config_lenses {
        run_lenses(&mut ins);
    }
    ins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_line_names_the_nodelay_state_present() {
        let mut p = ProcessSummary {
            pid: 7,
            comm: "wrk".into(),
            listening: 0,
            established: 4,
            server_ports: vec![],
            client_ports: vec![8080],
            nodelay_on: 4,
            nodelay_off: 0,
            nodelay_unknown: 0,
            cork_on: 0,
            pingpong: 0,
        };
        assert!(
            p.line()
                .contains("4 established to :8080, TCP_NODELAY on for 4/4"),
            "{}",
            p.line()
        );
        (p.nodelay_on, p.nodelay_off) = (1, 3);
        assert!(p.line().contains("TCP_NODELAY off on 3/4"), "{}", p.line());
        (p.nodelay_on, p.nodelay_off, p.nodelay_unknown) = (0, 0, 4);
        assert!(!p.line().contains("TCP_NODELAY"), "{}", p.line());
    }
}
