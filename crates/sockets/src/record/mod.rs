//! `lagtrace sockets --record`: a recorder of socket-configuration calls (socket, bind,
//! listen, connect, accept, accept4, setsockopt, getsockopt, close), strace-style.
//!
//! Two mechanisms, one output:
//! - [`bpf`] (first choice): a small BPF program on those calls (fexit trampolines on their
//!   kernel entry points, else the `syscalls:sys_enter_*`/`sys_exit_*` tracepoints), filtered in the kernel to the target's process tree (a hash
//!   of thread-group ids, extended on fork), reading option values and addresses from user
//!   memory and sending one event per call through a ring buffer. Nothing stops the
//!   program, so it can also attach to running processes ([`record_pids`]); events the ring
//!   buffer had no room for are counted ([`Recording::lost_events`]).
//! - [`ptrace`] (fallback where BPF is not allowed, `-- CMD` only): a seccomp filter stops
//!   CMD at those calls only, and we read them as its ptrace tracer.
//!
//! Not seen: socket calls made through the 32-bit (int 0x80 / x32) ABIs and io_uring socket
//! operations; under ptrace, descriptors duplicated with dup/fcntl (a later setsockopt on
//! them shows as an "inherited" socket; the BPF recorder follows dup, dup2, dup3 and
//! fcntl F_DUPFD of known sockets).

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use lagtrace_model::Privilege;

use serde::{Deserialize, Serialize};

mod book;
#[cfg(target_arch = "x86_64")]
pub mod bpf;
#[cfg(target_arch = "x86_64")]
mod ptrace;

/// How to record.
pub struct RecordOptions {
    /// Where to write each call as it completes, strace-style (`None`: only the result).
    pub live: Option<Box<dyn Write + Send>>,
    /// Also stop on `close` (of descriptors ≥ 3) to know when sockets end. Untracked
    /// descriptors are resumed at once.
    pub trace_close: bool,
    /// Which recorder to use.
    pub mechanism: Mechanism,
    /// Set from elsewhere (Ctrl-C) to end an attached recording before its window ends.
    pub stop: Option<Arc<AtomicBool>>,
    /// Called once an attached recording is in place, with every process it traces (the
    /// given ones and their descendants): calls made from then on are recorded.
    pub on_attached: Option<OnAttached>,
}

/// See [`RecordOptions::on_attached`].
pub type OnAttached = Box<dyn FnOnce(&[u32]) + Send>;

/// Which recorder to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mechanism {
    /// BPF where it can be loaded, else (for `-- CMD`) seccomp + ptrace.
    #[default]
    Auto,
    /// BPF only (its hooks as [`Hooks::Auto`]): an error where it cannot be loaded.
    Bpf,
    /// BPF on fentry/fexit trampolines only.
    Fentry,
    /// BPF on the syscall tracepoints only.
    Tracepoint,
    /// BPF on the raw `sys_exit` tracepoint only.
    Raw,
    /// seccomp + ptrace only (`-- CMD`).
    Ptrace,
}

impl Mechanism {
    /// The BPF recorder's hooks it asks for.
    pub fn hooks(self) -> Hooks {
        match self {
            Mechanism::Fentry => Hooks::Fentry,
            Mechanism::Tracepoint => Hooks::Tracepoint,
            Mechanism::Raw => Hooks::Raw,
            _ => Hooks::Auto,
        }
    }
}

/// Where the BPF recorder hooks the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hooks {
    /// fentry where trampolines attach, else the syscall tracepoints.
    #[default]
    Auto,
    /// fexit trampolines on the syscalls' kernel entry points: only those calls pay.
    Fentry,
    /// The `syscalls:sys_enter_*`/`sys_exit_*` tracepoints: every syscall of every task
    /// takes the kernel's tracing slow path while they are enabled.
    Tracepoint,
    /// One program on the raw `sys_exit` tracepoint (no perf record per call), keeping
    /// the recorded calls by number; the same slow path for every task.
    Raw,
}

impl Hooks {
    /// `fentry` or `tracepoint` (`auto` before one is chosen).
    pub fn name(self) -> &'static str {
        match self {
            Hooks::Auto => "auto",
            Hooks::Fentry => "fentry",
            Hooks::Tracepoint => "tracepoint",
            Hooks::Raw => "raw",
        }
    }
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            live: None,
            trace_close: true,
            mechanism: Mechanism::Auto,
            stop: None,
            on_attached: None,
        }
    }
}

impl std::fmt::Debug for RecordOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordOptions")
            .field("live", &self.live.is_some())
            .field("trace_close", &self.trace_close)
            .field("mechanism", &self.mechanism)
            .finish()
    }
}

/// One recorded system call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SyscallEvent {
    /// Thread id that made the call.
    pub tid: u32,
    /// Process (thread group) id.
    pub pid: u32,
    /// Microseconds since the recording started.
    pub time_us: u64,
    /// Call name (`setsockopt`).
    pub call: String,
    /// Decoded arguments, strace-style (`52, SOL_TCP, TCP_NODELAY, [1], 4`).
    pub args: String,
    /// Return value (`-errno` on failure, as the kernel returns it); 0 when not waited for
    /// (see `ret_known`).
    pub ret: i64,
    /// Whether the return value was seen. `close` is logged at its entry without waiting
    /// for the result (Linux frees the descriptor even when close fails), saving a stop
    /// per socket; its line then ends `= ?`, as strace writes an unknown result.
    #[serde(default = "yes")]
    pub ret_known: bool,
    /// The recorded socket it concerns (index into `Recording::sockets`).
    pub socket: Option<usize>,
}

fn yes() -> bool {
    true
}

impl SyscallEvent {
    /// `[pid N] setsockopt(52, SOL_TCP, TCP_NODELAY, [1], 4) = 0`.
    pub fn line(&self) -> String {
        format!(
            "[pid {}] {}({}) = {}",
            self.tid,
            self.call,
            self.args,
            if self.ret_known {
                ret_text(self.ret)
            } else {
                "?".into()
            }
        )
    }
}

fn ret_text(ret: i64) -> String {
    if (-4095..0).contains(&ret) {
        let e = (-ret) as i32;
        let name = errno_name(e);
        let msg = io::Error::from_raw_os_error(e).to_string();
        let msg = msg.split(" (os error").next().unwrap_or("").to_string();
        format!("-1 {name} ({msg})")
    } else {
        ret.to_string()
    }
}

/// An option value set on a socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OptionSet {
    /// Level name (`SOL_TCP`).
    pub level: String,
    /// Option name (`TCP_NODELAY`).
    pub option: String,
    /// Decoded value (`1`, or bytes for structures).
    pub value: String,
    /// Whether the call succeeded.
    pub ok: bool,
}

/// A socket the command created, accepted or used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RecordedSocket {
    /// Index in `Recording::sockets`.
    pub id: usize,
    /// Process that made it.
    pub pid: u32,
    /// Its descriptor number there.
    pub fd: i32,
    /// "socket", "accept" or "inherited" (first seen in a call, not created under us).
    pub origin: String,
    /// Address family (`AF_INET`), when known.
    pub family: Option<String>,
    /// Socket type (`SOCK_STREAM`), when known.
    pub kind: Option<String>,
    /// Whether it is a TCP socket (inet + stream).
    pub tcp: bool,
    /// Address it was bound to.
    pub bound: Option<String>,
    /// Peer it connected to or was accepted from.
    pub peer: Option<String>,
    /// Every setsockopt on it, in order.
    pub options: Vec<OptionSet>,
    /// Whether it was closed under us.
    pub closed: bool,
    /// For an accepted socket: the listening socket it came from (whose options, such as
    /// TCP_NODELAY, it inherited).
    pub listener: Option<usize>,
}

/// Sockets that set one option to one value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OptionCount {
    /// Level name.
    pub level: String,
    /// Option name.
    pub option: String,
    /// Value set.
    pub value: String,
    /// Number of distinct sockets that set it so (successfully).
    pub sockets: usize,
}

/// The result of [`record`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Recording {
    /// The command line that was recorded (`argv` in JSON: `command` is the envelope's);
    /// empty when processes were attached to.
    #[serde(rename = "argv")]
    pub command: Vec<String>,
    /// Every recorded call, in completion order.
    pub events: Vec<SyscallEvent>,
    /// Every socket seen.
    pub sockets: Vec<RecordedSocket>,
    /// Per option and value, how many sockets set it.
    pub option_summary: Vec<OptionCount>,
    /// TCP sockets that never set TCP_NODELAY (ids).
    pub never_nodelay: Vec<usize>,
    /// TCP sockets that never set TCP_QUICKACK (ids).
    pub never_quickack: Vec<usize>,
    /// TCP sockets in total.
    pub tcp_sockets: usize,
    /// CMD's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed CMD, when one did.
    pub signal: Option<i32>,
    /// Processes and threads followed.
    pub tasks: usize,
    /// How the calls were recorded: `bpf` (tracepoints, nothing stops the program) or
    /// `ptrace` (seccomp stops at each recorded call).
    #[serde(default)]
    pub mechanism: String,
    /// For `bpf`: where the calls were hooked, `fentry` (trampolines on the syscalls'
    /// kernel entry points: only those calls pay) or `tracepoint` (the syscall tracepoints:
    /// every syscall of every task takes the tracing slow path); absent for `ptrace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<String>,
    /// Why the first choice was not used: BPF, when the ptrace fallback was; fentry, when
    /// the BPF recorder hooked the syscall tracepoints.
    #[serde(default)]
    pub fallback: Option<String>,
    /// The processes attached to (`--record --pid/--process`); empty for `-- CMD`.
    #[serde(default)]
    pub attached: Vec<u32>,
    /// Calls and process events lost (BPF: the ring buffer or the pending-call table had
    /// no room); the recording is then incomplete by that many.
    #[serde(default)]
    pub lost_events: u64,
}

impl Recording {
    /// The status to exit with: CMD's code, or 128+N when signal N killed it; 0 for an
    /// attached recording whose window ended.
    pub fn exit_status(&self) -> u8 {
        if !self.attached.is_empty() {
            return 0;
        }
        match (self.exit_code, self.signal) {
            (Some(c), _) => c as u8,
            (None, Some(s)) => (128 + s) as u8,
            _ => 1,
        }
    }
}

/// Why a recording could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// CMD was empty.
    #[error("no command given to record")]
    NoCommand,
    /// CMD could not be started.
    #[error("cannot start {cmd}: {err}")]
    Spawn {
        /// The program.
        cmd: String,
        /// Why.
        err: io::Error,
    },
    /// ptrace refused (e.g. a seccomp or Yama policy, or a tracer is already attached).
    #[error("ptrace {what}: {err} (recording needs ptrace over its own child; refused by policy?)")]
    Ptrace {
        /// Which request.
        what: &'static str,
        /// Why.
        err: io::Error,
    },
    /// The architecture has no decoder yet.
    #[error("--record is implemented for x86_64 only")]
    Arch,
    /// No process to attach to.
    #[error("{0}")]
    NoProcess(String),
    /// Loading or attaching the BPF recorder needs CAP_BPF and CAP_PERFMON.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// The BPF recorder could not run otherwise (not built, verifier, no tracepoint).
    #[error("the BPF recorder: {0}")]
    Bpf(String),
}

// ---- names -------------------------------------------------------------------------------

fn errno_name(e: i32) -> &'static str {
    match e {
        1 => "EPERM",
        2 => "ENOENT",
        4 => "EINTR",
        9 => "EBADF",
        11 => "EAGAIN",
        13 => "EACCES",
        14 => "EFAULT",
        22 => "EINVAL",
        24 => "EMFILE",
        88 => "ENOTSOCK",
        92 => "ENOPROTOOPT",
        93 => "EPROTONOSUPPORT",
        95 => "EOPNOTSUPP",
        97 => "EAFNOSUPPORT",
        98 => "EADDRINUSE",
        99 => "EADDRNOTAVAIL",
        101 => "ENETUNREACH",
        103 => "ECONNABORTED",
        104 => "ECONNRESET",
        106 => "EISCONN",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        113 => "EHOSTUNREACH",
        114 => "EALREADY",
        115 => "EINPROGRESS",
        512 => "ERESTARTSYS",
        513 => "ERESTARTNOINTR",
        _ => "E?",
    }
}

fn family_name(f: u64) -> String {
    match f {
        1 => "AF_UNIX".into(),
        2 => "AF_INET".into(),
        10 => "AF_INET6".into(),
        16 => "AF_NETLINK".into(),
        17 => "AF_PACKET".into(),
        n => format!("{n}"),
    }
}

fn type_name(t: u64) -> String {
    let base = match t & 0xf {
        1 => "SOCK_STREAM".to_string(),
        2 => "SOCK_DGRAM".into(),
        3 => "SOCK_RAW".into(),
        5 => "SOCK_SEQPACKET".into(),
        n => format!("{n}"),
    };
    let mut s = base;
    if t & 0o4000 != 0 {
        s += "|SOCK_NONBLOCK";
    }
    if t & 0o2000000 != 0 {
        s += "|SOCK_CLOEXEC";
    }
    s
}

fn proto_name(p: u64) -> String {
    match p {
        0 => "IPPROTO_IP".into(),
        6 => "IPPROTO_TCP".into(),
        17 => "IPPROTO_UDP".into(),
        n => format!("{n}"),
    }
}

/// The name of a socket option level.
pub fn level_name(level: i64) -> String {
    match level {
        0 => "SOL_IP".into(),
        1 => "SOL_SOCKET".into(),
        6 => "SOL_TCP".into(),
        17 => "SOL_UDP".into(),
        41 => "SOL_IPV6".into(),
        n => format!("{n}"),
    }
}

/// The name of a socket option at a level.
pub fn option_name(level: i64, opt: i64) -> String {
    let n = match (level, opt) {
        (1, 1) => "SO_DEBUG",
        (1, 2) => "SO_REUSEADDR",
        (1, 3) => "SO_TYPE",
        (1, 4) => "SO_ERROR",
        (1, 5) => "SO_DONTROUTE",
        (1, 6) => "SO_BROADCAST",
        (1, 7) => "SO_SNDBUF",
        (1, 8) => "SO_RCVBUF",
        (1, 9) => "SO_KEEPALIVE",
        (1, 10) => "SO_OOBINLINE",
        (1, 12) => "SO_PRIORITY",
        (1, 13) => "SO_LINGER",
        (1, 15) => "SO_REUSEPORT",
        (1, 16) => "SO_PASSCRED",
        (1, 17) => "SO_PEERCRED",
        (1, 18) => "SO_RCVLOWAT",
        (1, 19) => "SO_SNDLOWAT",
        (1, 20) => "SO_RCVTIMEO_OLD",
        (1, 21) => "SO_SNDTIMEO_OLD",
        (1, 25) => "SO_BINDTODEVICE",
        (1, 30) => "SO_ACCEPTCONN",
        (1, 32) => "SO_SNDBUFFORCE",
        (1, 33) => "SO_RCVBUFFORCE",
        (1, 38) => "SO_PROTOCOL",
        (1, 39) => "SO_DOMAIN",
        (1, 46) => "SO_BUSY_POLL",
        (1, 60) => "SO_ZEROCOPY",
        (6, 1) => "TCP_NODELAY",
        (6, 2) => "TCP_MAXSEG",
        (6, 3) => "TCP_CORK",
        (6, 4) => "TCP_KEEPIDLE",
        (6, 5) => "TCP_KEEPINTVL",
        (6, 6) => "TCP_KEEPCNT",
        (6, 7) => "TCP_SYNCNT",
        (6, 8) => "TCP_LINGER2",
        (6, 9) => "TCP_DEFER_ACCEPT",
        (6, 10) => "TCP_WINDOW_CLAMP",
        (6, 11) => "TCP_INFO",
        (6, 12) => "TCP_QUICKACK",
        (6, 13) => "TCP_CONGESTION",
        (6, 18) => "TCP_USER_TIMEOUT",
        (6, 23) => "TCP_FASTOPEN",
        (6, 25) => "TCP_NOTSENT_LOWAT",
        (6, 30) => "TCP_FASTOPEN_CONNECT",
        (6, 31) => "TCP_ULP",
        (6, 37) => "TCP_TX_DELAY",
        (0, 1) => "IP_TOS",
        (0, 2) => "IP_TTL",
        (0, 10) => "IP_MTU_DISCOVER",
        (0, 11) => "IP_RECVERR",
        (0, 15) => "IP_FREEBIND",
        (0, 19) => "IP_TRANSPARENT",
        (0, 24) => "IP_BIND_ADDRESS_NO_PORT",
        (41, 16) => "IPV6_UNICAST_HOPS",
        (41, 23) => "IPV6_MTU_DISCOVER",
        (41, 25) => "IPV6_RECVERR",
        (41, 26) => "IPV6_V6ONLY",
        (41, 67) => "IPV6_TCLASS",
        _ => return format!("{opt}"),
    };
    n.into()
}

/// Decodes an option value as strace does: `[1]` for an int, a string for names, bytes
/// otherwise.
pub fn value_text(level: i64, opt: i64, b: &[u8]) -> String {
    if level == 6 && (opt == 13 || opt == 31) {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        return format!("{:?}", String::from_utf8_lossy(&b[..end]));
    }
    if level == 1 && opt == 13 && b.len() >= 8 {
        let on = i32::from_ne_bytes(b[0..4].try_into().expect("4"));
        let l = i32::from_ne_bytes(b[4..8].try_into().expect("4"));
        return format!("{{l_onoff={on}, l_linger={l}}}");
    }
    if b.len() == 4 {
        return format!("[{}]", i32::from_ne_bytes(b.try_into().expect("4")));
    }
    let hex: String = b.iter().map(|c| format!("\\x{c:02x}")).collect();
    format!("\"{hex}\"")
}

/// Decodes a sockaddr: `{AF_INET, 127.0.0.1:8080}`; the address for summaries too.
fn sockaddr_text(b: &[u8]) -> (String, Option<SocketAddr>) {
    if b.len() < 2 {
        return ("{}".into(), None);
    }
    let fam = u16::from_ne_bytes([b[0], b[1]]);
    match fam {
        2 if b.len() >= 8 => {
            let a = SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])),
                u16::from_be_bytes([b[2], b[3]]),
            );
            (format!("{{AF_INET, {a}}}"), Some(a))
        }
        10 if b.len() >= 24 => {
            let ip: [u8; 16] = b[8..24].try_into().expect("16");
            let a = SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(ip)),
                u16::from_be_bytes([b[2], b[3]]),
            );
            (format!("{{AF_INET6, {a}}}"), Some(a))
        }
        1 => {
            let p = &b[2..];
            let (abs, p) = if p.first() == Some(&0) && p.len() > 1 {
                ("@", &p[1..])
            } else {
                ("", p)
            };
            let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
            (
                format!(
                    "{{AF_UNIX, \"{abs}{}\"}}",
                    String::from_utf8_lossy(&p[..end])
                ),
                None,
            )
        }
        f => (format!("{{{}}}", family_name(u64::from(f))), None),
    }
}

/// x86_64 system call numbers of the recorded calls.
mod nr {
    pub const AUDIT_ARCH: u32 = 0xC000_003E;
    pub const SOCKET: u64 = 41;
    pub const CONNECT: u64 = 42;
    pub const ACCEPT: u64 = 43;
    pub const BIND: u64 = 49;
    pub const LISTEN: u64 = 50;
    pub const SETSOCKOPT: u64 = 54;
    pub const GETSOCKOPT: u64 = 55;
    pub const ACCEPT4: u64 = 288;
    pub const CLOSE: u64 = 3;
    pub const DUP: u64 = 32;
    pub const DUP2: u64 = 33;
    pub const DUP3: u64 = 292;
    pub const FCNTL: u64 = 72;
}

/// Runs `cmd` (program and arguments) under the recorder until it and every process it
/// started have exited. CMD's stdin/stdout/stderr are ours. BPF first; where it cannot be
/// loaded (and `opts.mechanism` allows), seccomp + ptrace, with the reason in
/// [`Recording::fallback`].
#[cfg(target_arch = "x86_64")]
pub fn record(cmd: &[String], mut opts: RecordOptions) -> Result<Recording, RecordError> {
    if cmd.is_empty() {
        return Err(RecordError::NoCommand);
    }
    let why = match opts.mechanism {
        Mechanism::Ptrace => None,
        Mechanism::Bpf | Mechanism::Fentry | Mechanism::Tracepoint | Mechanism::Raw => {
            return bpf::record_cmd(cmd, opts);
        }
        Mechanism::Auto => match bpf::Recorder::load(opts.trace_close, Hooks::Auto) {
            Ok(r) => return r.run_cmd(cmd, opts),
            Err(e) => Some(e.to_string()),
        },
    };
    opts.mechanism = Mechanism::Ptrace;
    let mut rec = ptrace::record(cmd, opts)?;
    rec.fallback = why;
    Ok(rec)
}

/// Recording needs a syscall decoder for the architecture; x86_64 only so far.
#[cfg(not(target_arch = "x86_64"))]
pub fn record(_cmd: &[String], _opts: RecordOptions) -> Result<Recording, RecordError> {
    Err(RecordError::Arch)
}

/// Records the socket calls of running processes (and of the processes they start) for
/// `window`, or until they have all exited or `opts.stop` is set. BPF only: ptrace would
/// stop them. Their existing children are followed too (an nginx master's workers).
#[cfg(target_arch = "x86_64")]
pub fn record_pids(
    pids: &[u32],
    window: Duration,
    opts: RecordOptions,
) -> Result<Recording, RecordError> {
    if pids.is_empty() {
        return Err(RecordError::NoProcess("no process to attach to".into()));
    }
    if opts.mechanism == Mechanism::Ptrace {
        return Err(RecordError::Bpf(
            "attaching to a running process needs the BPF recorder (ptrace would stop it)".into(),
        ));
    }
    for &p in pids {
        if !std::path::Path::new(&format!("/proc/{p}")).exists() {
            return Err(RecordError::NoProcess(format!("no process {p}")));
        }
    }
    bpf::Recorder::load(opts.trace_close, opts.mechanism.hooks())?.run_pids(pids, window, opts)
}

/// The running processes whose command name (`/proc/PID/comm`) is `name`, in pid order.
pub fn pids_named(name: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end_matches('\n') == name)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Attaching needs the BPF recorder, built for x86_64 only so far.
#[cfg(not(target_arch = "x86_64"))]
pub fn record_pids(
    _pids: &[u32],
    _window: Duration,
    _opts: RecordOptions,
) -> Result<Recording, RecordError> {
    Err(RecordError::Arch)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        assert_eq!(level_name(6), "SOL_TCP");
        assert_eq!(option_name(6, 1), "TCP_NODELAY");
        assert_eq!(option_name(6, 12), "TCP_QUICKACK");
        assert_eq!(option_name(1, 2), "SO_REUSEADDR");
        assert_eq!(value_text(6, 1, &1i32.to_ne_bytes()), "[1]");
        assert_eq!(value_text(6, 13, b"cubic\0"), "\"cubic\"");
        assert_eq!(
            type_name(1 | 0o4000 | 0o2000000),
            "SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC"
        );
        assert_eq!(ret_text(-115), "-1 EINPROGRESS (Operation now in progress)");
        let mut sa = vec![2u8, 0, 0x1f, 0x90, 127, 0, 0, 1];
        sa.extend_from_slice(&[0; 8]);
        assert_eq!(sockaddr_text(&sa).0, "{AF_INET, 127.0.0.1:8080}");
    }
}
