//! `lagtrace sockets --record -- CMD`: a recorder of socket-configuration calls.
//!
//! CMD runs under a seccomp filter that returns `SECCOMP_RET_TRACE` only for socket,
//! connect, accept, accept4, bind, listen, setsockopt, getsockopt and close (of fds ≥ 3);
//! every other system call runs at full speed, without a stop. We are CMD's ptrace tracer
//! (`PTRACE_O_TRACESECCOMP | TRACEFORK | TRACEVFORK | TRACECLONE | EXITKILL`): at each
//! seccomp stop we read the arguments (option values through `process_vm_readv`), resume
//! with `PTRACE_SYSCALL` to see the return value at the syscall-exit stop, then let the task
//! run on with `PTRACE_CONT`. A `close` is never waited for: of a descriptor that is not a
//! recorded socket it is resumed at once without a log line, of a recorded socket it is
//! logged at entry (`= ?`), since Linux frees the descriptor whatever close returns.
//!
//! Not seen: socket calls made through the 32-bit (int 0x80 / x32) ABIs, descriptors
//! duplicated with dup/fcntl (a later setsockopt on them shows as an "inherited" socket),
//! and io_uring socket operations.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// How to record.
pub struct RecordOptions {
    /// Where to write each call as it completes, strace-style (`None`: only the result).
    pub live: Option<Box<dyn Write + Send>>,
    /// Also stop on `close` (of descriptors ≥ 3) to know when sockets end. Untracked
    /// descriptors are resumed at once.
    pub trace_close: bool,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            live: None,
            trace_close: true,
        }
    }
}

impl std::fmt::Debug for RecordOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordOptions")
            .field("live", &self.live.is_some())
            .field("trace_close", &self.trace_close)
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
    /// Microseconds since CMD started.
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
    /// The command line that was recorded (`argv` in JSON: `command` is the envelope's).
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
}

impl Recording {
    /// The status to exit with: CMD's code, or 128+N when signal N killed it.
    pub fn exit_status(&self) -> u8 {
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

// ---- seccomp filter ----------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod arch {
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

    pub struct Regs {
        pub nr: u64,
        pub args: [u64; 6],
        pub ret: i64,
    }

    pub fn regs(tid: i32) -> std::io::Result<Regs> {
        // SAFETY: an all-zero user_regs_struct is valid; PTRACE_GETREGS fills it.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: tid is a stopped tracee of ours; r is a valid out-parameter.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                tid,
                std::ptr::null_mut::<libc::c_void>(),
                &raw mut r,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Regs {
            nr: r.orig_rax,
            args: [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9],
            ret: r.rax as i64,
        })
    }
}

fn bpf_stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The seccomp program: trace the socket calls (and `close(fd >= 3)`), allow the rest.
#[cfg(target_arch = "x86_64")]
fn filter(trace_close: bool) -> Vec<libc::sock_filter> {
    const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let nrs = [
        arch::SOCKET,
        arch::CONNECT,
        arch::ACCEPT,
        arch::BIND,
        arch::LISTEN,
        arch::SETSOCKOPT,
        arch::GETSOCKOPT,
        arch::ACCEPT4,
    ];
    let n = nrs.len();
    // Layout: 0 ld arch; 1 jeq arch; 2 ld nr; 3..3+n jeq nr→TRACE;
    // [close: 3+n jeq close; 4+n ld arg0; 5+n jge 3 → TRACE]; ALLOW; TRACE.
    let close_len = if trace_close { 3 } else { 0 };
    let allow = 3 + n + close_len;
    let trace = allow + 1;
    let mut f = Vec::with_capacity(trace + 1);
    f.push(bpf_stmt(LD_ABS, 4));
    f.push(bpf_jump(JEQ, arch::AUDIT_ARCH, 0, (allow - 2) as u8));
    f.push(bpf_stmt(LD_ABS, 0));
    for (i, nr) in nrs.iter().enumerate() {
        let at = 3 + i;
        f.push(bpf_jump(JEQ, *nr as u32, (trace - at - 1) as u8, 0));
    }
    if trace_close {
        let at = 3 + n;
        f.push(bpf_jump(JEQ, arch::CLOSE as u32, 0, (allow - at - 1) as u8));
        f.push(bpf_stmt(LD_ABS, 16));
        let at = at + 2;
        f.push(bpf_jump(
            JGE,
            3,
            (trace - at - 1) as u8,
            (allow - at - 1) as u8,
        ));
    }
    f.push(bpf_stmt(RET, libc::SECCOMP_RET_ALLOW));
    f.push(bpf_stmt(RET, libc::SECCOMP_RET_TRACE));
    f
}

/// Nice value of the tracer thread while recording.
const TRACER_NICE: i32 = -10;

// ---- the tracer --------------------------------------------------------------------------

fn read_mem(tid: i32, addr: u64, len: usize) -> Option<Vec<u8>> {
    if addr == 0 || len == 0 {
        return None;
    }
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: local points to our buffer of `len` bytes; the kernel checks the remote side.
    let n = unsafe { libc::process_vm_readv(tid, &raw const local, 1, &raw const remote, 1, 0) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

fn ptrace(req: libc::c_uint, tid: i32, data: usize) -> io::Result<()> {
    // SAFETY: requests used here take an integer `data` and no address.
    let rc = unsafe {
        libc::ptrace(
            req,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn tgid_of(tid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(tid as u32)
}

struct Pending {
    nr: u64,
    args: [u64; 6],
    /// Text decoded at entry (values readable only before the call).
    entry: Option<String>,
    /// Option name/value decoded at entry (setsockopt).
    set: Option<(String, String, String)>,
    /// Address decoded at entry (bind/connect).
    addr: Option<String>,
}

/// What a syscall exit logs: the call's name, its arguments as text, the socket it concerns.
type Exited = (&'static str, String, Option<usize>);

struct Task {
    tgid: u32,
    pending: Option<Pending>,
    started: bool,
}

struct Tracer {
    start: Instant,
    opts: RecordOptions,
    tasks: HashMap<i32, Task>,
    fds: HashMap<(u32, i32), usize>,
    sockets: Vec<RecordedSocket>,
    events: Vec<SyscallEvent>,
    seen_tasks: usize,
}

impl Tracer {
    fn task(&mut self, tid: i32) -> &mut Task {
        if !self.tasks.contains_key(&tid) {
            self.seen_tasks += 1;
        }
        self.tasks.entry(tid).or_insert_with(|| Task {
            tgid: tgid_of(tid),
            pending: None,
            started: false,
        })
    }

    fn new_socket(&mut self, pid: u32, fd: i32, origin: &str) -> usize {
        let id = self.sockets.len();
        self.sockets.push(RecordedSocket {
            id,
            pid,
            fd,
            origin: origin.into(),
            family: None,
            kind: None,
            tcp: false,
            bound: None,
            peer: None,
            options: vec![],
            closed: false,
            listener: None,
        });
        self.fds.insert((pid, fd), id);
        id
    }

    fn socket_for(&mut self, pid: u32, fd: i32) -> usize {
        match self.fds.get(&(pid, fd)) {
            Some(&id) => id,
            None => self.new_socket(pid, fd, "inherited"),
        }
    }

    /// Seccomp stop: decode the entry. Returns whether to wait for the syscall's exit.
    fn on_entry(&mut self, tid: i32) -> bool {
        let Ok(r) = arch::regs(tid) else {
            return false;
        };
        let tgid = self.task(tid).tgid;
        let a = r.args;
        let mut p = Pending {
            nr: r.nr,
            args: a,
            entry: None,
            set: None,
            addr: None,
        };
        match r.nr {
            arch::CLOSE => {
                // Not a socket of ours: no log. Ours: logged now, without an exit stop —
                // the descriptor is released whatever close returns.
                let fd = a[0] as i32;
                if let Some(id) = self.fds.remove(&(tgid, fd)) {
                    self.sockets[id].closed = true;
                    self.log(tid, tgid, "close", format!("{fd}"), 0, false, Some(id));
                }
                return false;
            }
            arch::SETSOCKOPT => {
                let (level, opt, len) = (a[1] as i32 as i64, a[2] as i32 as i64, a[4] as usize);
                let v = read_mem(tid, a[3], len.min(256))
                    .map(|b| value_text(level, opt, &b))
                    .unwrap_or_else(|| format!("{:#x}", a[3]));
                let (ln, on) = (level_name(level), option_name(level, opt));
                p.entry = Some(format!("{}, {ln}, {on}, {v}, {len}", a[0] as i32));
                let raw = v.trim_start_matches('[').trim_end_matches(']').to_string();
                p.set = Some((ln, on, raw));
            }
            arch::BIND | arch::CONNECT => {
                let (t, _) = read_mem(tid, a[1], (a[2] as usize).min(128))
                    .map(|b| sockaddr_text(&b))
                    .unwrap_or_else(|| (format!("{:#x}", a[1]), None));
                p.entry = Some(format!("{}, {t}, {}", a[0] as i32, a[2] as u32));
                p.addr = Some(t);
            }
            _ => {}
        }
        self.task(tid).pending = Some(p);
        true
    }

    /// Syscall-exit stop: decode the result and log.
    fn on_exit(&mut self, tid: i32) {
        let Some(p) = self.task(tid).pending.take() else {
            return;
        };
        let tgid = self.task(tid).tgid;
        let ret = arch::regs(tid).map(|r| r.ret).unwrap_or(-1);
        let a = p.args;
        let fd0 = a[0] as i32;
        let ok = ret >= 0;
        let (call, args, socket) = match p.nr {
            arch::SOCKET => self.exit_socket(tgid, &a, ret),
            arch::ACCEPT | arch::ACCEPT4 => self.exit_accept(tid, tgid, &p, ret),
            arch::BIND | arch::CONNECT => {
                let id = self.socket_for(tgid, fd0);
                let s = &mut self.sockets[id];
                let addr = p.addr.clone();
                // a non-blocking connect returns EINPROGRESS: still the peer
                if p.nr == arch::BIND && ok {
                    s.bound = addr;
                } else if p.nr == arch::CONNECT && (ok || ret == -115) {
                    s.peer = addr;
                }
                let call = if p.nr == arch::BIND {
                    "bind"
                } else {
                    "connect"
                };
                (call, p.entry.clone().unwrap_or_default(), Some(id))
            }
            arch::LISTEN => {
                let id = self.socket_for(tgid, fd0);
                ("listen", format!("{fd0}, {}", a[1] as i32), Some(id))
            }
            arch::SETSOCKOPT => {
                let id = self.socket_for(tgid, fd0);
                if let Some((level, option, value)) = p.set.clone() {
                    self.sockets[id].options.push(OptionSet {
                        level,
                        option,
                        value,
                        ok,
                    });
                }
                ("setsockopt", p.entry.clone().unwrap_or_default(), Some(id))
            }
            arch::GETSOCKOPT => self.exit_getsockopt(tid, tgid, &a, ret),
            _ => return,
        };
        self.log(tid, tgid, call, args, ret, true, socket);
    }

    /// socket(2) returned: a new socket with its family and type.
    fn exit_socket(&mut self, tgid: u32, a: &[u64; 6], ret: i64) -> Exited {
        let args = format!(
            "{}, {}, {}",
            family_name(a[0]),
            type_name(a[1]),
            proto_name(a[2])
        );
        let sock = (ret >= 0).then(|| {
            let id = self.new_socket(tgid, ret as i32, "socket");
            let s = &mut self.sockets[id];
            s.family = Some(family_name(a[0]));
            s.kind = Some(type_name(a[1] & 0xf));
            s.tcp = (a[0] == 2 || a[0] == 10) && a[1] & 0xf == 1;
            id
        });
        ("socket", args, sock)
    }

    /// accept(2)/accept4(2) returned: a new socket with the peer's address, its family and
    /// TCP-ness from the listener (or from the peer address when the listener is unknown).
    fn exit_accept(&mut self, tid: i32, tgid: u32, p: &Pending, ret: i64) -> Exited {
        let a = p.args;
        let fd0 = a[0] as i32;
        let ok = ret >= 0;
        let peer = if ok && a[1] != 0 {
            let len = read_mem(tid, a[2], 4)
                .filter(|b| b.len() == 4)
                .map(|b| u32::from_ne_bytes(b[..4].try_into().expect("4")) as usize)
                .unwrap_or(0);
            read_mem(tid, a[1], len.min(128)).map(|b| sockaddr_text(&b).0)
        } else {
            None
        };
        let args = format!(
            "{fd0}, {}, {}",
            peer.clone().unwrap_or_else(|| if a[1] == 0 {
                "NULL".into()
            } else {
                format!("{:#x}", a[1])
            }),
            if a[2] == 0 {
                "NULL".into()
            } else {
                "[..]".to_string()
            }
        );
        let call = if p.nr == arch::ACCEPT {
            "accept"
        } else {
            "accept4"
        };
        let listener = self.fds.get(&(tgid, fd0)).copied();
        let sock = ok.then(|| {
            let id = self.new_socket(tgid, ret as i32, "accept");
            let (fam, tcp) = match listener.map(|l| &self.sockets[l]) {
                Some(l) => (l.family.clone(), l.tcp),
                None => {
                    let fam = peer.as_deref().map(|t| {
                        t.trim_start_matches('{')
                            .split(',')
                            .next()
                            .unwrap_or("")
                            .to_string()
                    });
                    let tcp = matches!(fam.as_deref(), Some("AF_INET" | "AF_INET6"));
                    (fam, tcp)
                }
            };
            let s = &mut self.sockets[id];
            s.family = fam;
            s.kind = Some("SOCK_STREAM".into());
            s.tcp = tcp;
            s.peer = peer.clone();
            s.listener = listener;
            id
        });
        (call, args, sock)
    }

    /// getsockopt(2) returned: the value read back, decoded.
    fn exit_getsockopt(&mut self, tid: i32, tgid: u32, a: &[u64; 6], ret: i64) -> Exited {
        let fd0 = a[0] as i32;
        let (level, opt) = (a[1] as i32 as i64, a[2] as i32 as i64);
        let len = read_mem(tid, a[4], 4)
            .filter(|b| b.len() == 4)
            .map(|b| u32::from_ne_bytes(b[..4].try_into().expect("4")));
        let v = if ret >= 0 {
            read_mem(tid, a[3], len.unwrap_or(0).min(256) as usize)
                .map(|b| value_text(level, opt, &b))
                .unwrap_or_else(|| format!("{:#x}", a[3]))
        } else {
            format!("{:#x}", a[3])
        };
        let id = self.fds.get(&(tgid, fd0)).copied();
        let args = format!(
            "{fd0}, {}, {}, {v}, [{}]",
            level_name(level),
            option_name(level, opt),
            len.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
        );
        ("getsockopt", args, id)
    }

    #[allow(clippy::too_many_arguments)]
    fn log(
        &mut self,
        tid: i32,
        tgid: u32,
        call: &str,
        args: String,
        ret: i64,
        ret_known: bool,
        socket: Option<usize>,
    ) {
        let ev = SyscallEvent {
            tid: tid as u32,
            pid: tgid,
            time_us: self.start.elapsed().as_micros() as u64,
            call: call.into(),
            args,
            ret,
            ret_known,
            socket,
        };
        if let Some(w) = self.opts.live.as_mut() {
            // The trace is best effort: a closed pipe must not kill CMD.
            let _ = writeln!(w, "{}", ev.line());
        }
        self.events.push(ev);
    }

    /// A new task from fork/vfork/clone: a forked process gets a copy of its parent's
    /// descriptor table.
    fn on_new_task(&mut self, parent: i32, child: i32) {
        let ptgid = self.task(parent).tgid;
        let ctgid = self.task(child).tgid;
        if ctgid != ptgid {
            let copies: Vec<((u32, i32), usize)> = self
                .fds
                .iter()
                .filter(|((p, _), _)| *p == ptgid)
                .map(|((_, fd), id)| ((ctgid, *fd), *id))
                .collect();
            self.fds.extend(copies);
        }
    }

    fn finish(
        self,
        command: Vec<String>,
        exit_code: Option<i32>,
        signal: Option<i32>,
    ) -> Recording {
        let mut counts: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for s in &self.sockets {
            let mut seen = std::collections::BTreeSet::new();
            for o in s.options.iter().filter(|o| o.ok) {
                let k = (o.level.clone(), o.option.clone(), o.value.clone());
                if seen.insert(k.clone()) {
                    *counts.entry(k).or_default() += 1;
                }
            }
        }
        let tcp: Vec<&RecordedSocket> = self.sockets.iter().filter(|s| s.tcp).collect();
        // An accepted socket inherits most options set on its listener (the kernel clones
        // the listener: Nagle/cork flags, buffers, keepalive); counted as set if the
        // listener set it at all (the order is in `events`). Not the ACK mode: a new
        // socket starts with fresh delayed-ACK state, so TCP_QUICKACK is never inherited.
        let set =
            |s: &RecordedSocket, name: &str| s.options.iter().any(|o| o.option == name && o.ok);
        let never = |name: &str| -> Vec<usize> {
            tcp.iter()
                .filter(|s| {
                    !set(s, name)
                        && (name == "TCP_QUICKACK"
                            || !s.listener.is_some_and(|l| set(&self.sockets[l], name)))
                })
                .map(|s| s.id)
                .collect()
        };
        Recording {
            command,
            never_nodelay: never("TCP_NODELAY"),
            never_quickack: never("TCP_QUICKACK"),
            tcp_sockets: tcp.len(),
            option_summary: counts
                .into_iter()
                .map(|((level, option, value), sockets)| OptionCount {
                    level,
                    option,
                    value,
                    sockets,
                })
                .collect(),
            events: self.events,
            sockets: self.sockets,
            exit_code,
            signal,
            tasks: self.seen_tasks,
        }
    }
}

/// Runs `cmd` (program and arguments) under the recorder until it and every process it
/// started have exited. CMD's stdin/stdout/stderr are ours.
#[cfg(target_arch = "x86_64")]
pub fn record(cmd: &[String], opts: RecordOptions) -> Result<Recording, RecordError> {
    let (prog, rest) = cmd.split_first().ok_or(RecordError::NoCommand)?;
    let start = Instant::now();
    let child = spawn_traced(prog, rest, opts.trace_close)?;
    let main = child.id() as i32;
    raise_tracer_priority();
    attach(main)?;
    let mut t = Tracer {
        start,
        opts,
        tasks: HashMap::new(),
        fds: HashMap::new(),
        sockets: Vec::new(),
        events: Vec::new(),
        seen_tasks: 0,
    };
    t.task(main).started = true;
    ptrace(libc::PTRACE_CONT, main, 0).map_err(|err| RecordError::Ptrace {
        what: "PTRACE_CONT",
        err,
    })?;
    let (mut exit_code, mut signal) = (None, None);
    loop {
        let mut status = 0;
        // SAFETY: waiting for any of our (traced) children.
        let tid = unsafe { libc::waitpid(-1, &raw mut status, libc::__WALL) };
        if tid < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break; // ECHILD: every task is gone
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if tid == main {
                if libc::WIFEXITED(status) {
                    exit_code = Some(libc::WEXITSTATUS(status));
                } else {
                    signal = Some(libc::WTERMSIG(status));
                }
            }
            t.tasks.remove(&tid);
            continue;
        }
        if libc::WIFSTOPPED(status) {
            t.on_stop(tid, status);
        }
    }
    drop(child);
    Ok(t.finish(cmd.to_vec(), exit_code, signal))
}

/// Starts CMD traced from its first instruction: PTRACE_TRACEME, no new privileges, and the
/// seccomp filter that stops it only at the socket calls.
#[cfg(target_arch = "x86_64")]
fn spawn_traced(
    prog: &String,
    rest: &[String],
    trace_close: bool,
) -> Result<std::process::Child, RecordError> {
    use std::os::unix::process::CommandExt;

    let prog_filter = filter(trace_close);
    let mut c = std::process::Command::new(prog);
    c.args(rest);
    // SAFETY: the closure only makes async-signal-safe system calls (ptrace, prctl, seccomp)
    // on data prepared before fork; it allocates nothing.
    unsafe {
        c.pre_exec(move || {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            let prog = libc::sock_fprog {
                len: prog_filter.len() as u16,
                filter: prog_filter.as_ptr().cast_mut(),
            };
            if libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &raw const prog,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.spawn().map_err(|err| RecordError::Spawn {
        cmd: prog.clone(),
        err,
    })
}

#[cfg(target_arch = "x86_64")]
fn raise_tracer_priority() {
    // Every stop holds a tracee thread (and all the connections it serves) until we have
    // run: on a busy machine the wait for a CPU dominates the cost of a stop. So this
    // thread (only: policy and nice are per thread on Linux, and CMD was forked before)
    // runs SCHED_FIFO at the lowest real-time priority — it does microseconds of work per
    // stop and sleeps in waitpid otherwise — or, without that right, at nice -10.
    // Best effort: without CAP_SYS_NICE both fail and nothing changes.
    // SAFETY: scheduling calls on the calling thread (pid 0) with a valid sched_param.
    unsafe {
        let p = libc::sched_param { sched_priority: 1 };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const p) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, TRACER_NICE);
        }
    }
}

/// Waits for CMD's stop at its exec and sets the trace options (forks, clones, exec,
/// seccomp stops; CMD killed if we die).
#[cfg(target_arch = "x86_64")]
fn attach(main: i32) -> Result<(), RecordError> {
    // Without PTRACE_O_TRACEEXEC yet, the exec leaves the child stopped with SIGTRAP.
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let w = unsafe { libc::waitpid(main, &raw mut status, libc::__WALL) };
    if w != main || !libc::WIFSTOPPED(status) {
        return Err(RecordError::Ptrace {
            what: "initial stop",
            err: io::Error::other(format!("unexpected wait status {status:#x}")),
        });
    }
    let options = libc::PTRACE_O_TRACESECCOMP
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_TRACESYSGOOD
        | libc::PTRACE_O_EXITKILL;
    ptrace(libc::PTRACE_SETOPTIONS, main, options as usize).map_err(|err| RecordError::Ptrace {
        what: "PTRACE_SETOPTIONS",
        err,
    })
}

#[cfg(target_arch = "x86_64")]
impl Tracer {
    /// A tracee stopped: decode a syscall entry or exit, follow a new task, or pass a real
    /// signal on; then resume it.
    fn on_stop(&mut self, tid: i32, status: i32) {
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        let mut resume = libc::PTRACE_CONT;
        let mut inject = 0;
        if sig == libc::SIGTRAP | 0x80 {
            self.on_exit(tid);
        } else if sig == libc::SIGTRAP && event == libc::PTRACE_EVENT_SECCOMP {
            if self.on_entry(tid) {
                resume = libc::PTRACE_SYSCALL;
            }
        } else if sig == libc::SIGTRAP
            && (event == libc::PTRACE_EVENT_FORK
                || event == libc::PTRACE_EVENT_VFORK
                || event == libc::PTRACE_EVENT_CLONE)
        {
            let mut new: libc::c_ulong = 0;
            // SAFETY: PTRACE_GETEVENTMSG writes one c_ulong.
            let rc = unsafe {
                libc::ptrace(
                    libc::PTRACE_GETEVENTMSG,
                    tid,
                    std::ptr::null_mut::<libc::c_void>(),
                    &raw mut new,
                )
            };
            if rc == 0 {
                self.on_new_task(tid, new as i32);
            }
        } else if sig == libc::SIGTRAP && event != 0 {
            // exec and other events: nothing to do
        } else if sig == libc::SIGSTOP && !self.task(tid).started {
            // a new task's initial stop
            self.task(tid).started = true;
        } else {
            // a real signal: deliver it
            self.task(tid).started = true;
            inject = sig as usize;
        }
        // The task may have been killed meanwhile (ESRCH): its exit comes through wait.
        let _ = ptrace(resume, tid, inject);
    }
}

/// Recording needs a syscall decoder for the architecture; x86_64 only so far.
#[cfg(not(target_arch = "x86_64"))]
pub fn record(_cmd: &[String], _opts: RecordOptions) -> Result<Recording, RecordError> {
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
