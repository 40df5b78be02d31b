//! The fallback recorder, where BPF is not allowed: CMD runs under a seccomp filter that
//! returns `SECCOMP_RET_TRACE` only for socket, connect, accept, accept4, bind, listen,
//! setsockopt, getsockopt and close (of fds ≥ 3); every other system call runs at full
//! speed, without a stop. We are CMD's ptrace tracer (`PTRACE_O_TRACESECCOMP | TRACEFORK |
//! TRACEVFORK | TRACECLONE | EXITKILL`): at each seccomp stop we read the arguments (option
//! values through `process_vm_readv`), resume with `PTRACE_SYSCALL` to see the return value
//! at the syscall-exit stop, then let the task run on with `PTRACE_CONT`. A `close` is never
//! waited for: of a descriptor that is not a recorded socket it is resumed at once without a
//! log line, of a recorded socket it is logged at entry (`= ?`). Every recorded call stops
//! the calling thread twice: on a new connection per request that costs most of the
//! program's speed, which is why the BPF recorder comes first.

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use super::book::{Book, Call};
use super::{RecordError, RecordOptions, Recording, nr};

mod arch {
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
fn filter(trace_close: bool) -> Vec<libc::sock_filter> {
    const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let nrs = [
        nr::SOCKET,
        nr::CONNECT,
        nr::ACCEPT,
        nr::BIND,
        nr::LISTEN,
        nr::SETSOCKOPT,
        nr::GETSOCKOPT,
        nr::ACCEPT4,
    ];
    let n = nrs.len();
    // Layout: 0 ld arch; 1 jeq arch; 2 ld nr; 3..3+n jeq nr→TRACE;
    // [close: 3+n jeq close; 4+n ld arg0; 5+n jge 3 → TRACE]; ALLOW; TRACE.
    let close_len = if trace_close { 3 } else { 0 };
    let allow = 3 + n + close_len;
    let trace = allow + 1;
    let mut f = Vec::with_capacity(trace + 1);
    f.push(bpf_stmt(LD_ABS, 4));
    f.push(bpf_jump(JEQ, nr::AUDIT_ARCH, 0, (allow - 2) as u8));
    f.push(bpf_stmt(LD_ABS, 0));
    for (i, nr) in nrs.iter().enumerate() {
        let at = 3 + i;
        f.push(bpf_jump(JEQ, *nr as u32, (trace - at - 1) as u8, 0));
    }
    if trace_close {
        let at = 3 + n;
        f.push(bpf_jump(JEQ, nr::CLOSE as u32, 0, (allow - at - 1) as u8));
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

/// A call entered, waiting for its exit stop.
struct Pending {
    nr: u64,
    args: [u64; 6],
    /// User memory readable only before the call (option value, address).
    entry: Option<Vec<u8>>,
}

struct Task {
    tgid: u32,
    pending: Option<Pending>,
    started: bool,
}

struct Tracer {
    start: Instant,
    book: Book,
    tasks: HashMap<i32, Task>,
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

    fn call(&self, tid: i32, tgid: u32, nr: u64, args: [u64; 6]) -> Call {
        Call {
            tid: tid as u32,
            tgid,
            time_us: self.start.elapsed().as_micros() as u64,
            nr,
            args,
            ..Call::default()
        }
    }

    /// Seccomp stop: decode the entry. Returns whether to wait for the syscall's exit.
    fn on_entry(&mut self, tid: i32) -> bool {
        let Ok(r) = arch::regs(tid) else {
            return false;
        };
        let tgid = self.task(tid).tgid;
        let a = r.args;
        let entry = match r.nr {
            nr::CLOSE => {
                // Not a socket of ours: no log. Ours: logged now, without an exit stop —
                // the descriptor is released whatever close returns.
                if self.book.is_socket(tgid, a[0] as i32) {
                    let c = self.call(tid, tgid, r.nr, a);
                    self.book.on_call(&c);
                }
                return false;
            }
            nr::SETSOCKOPT => read_mem(tid, a[3], (a[4] as usize).min(256)),
            nr::BIND | nr::CONNECT => read_mem(tid, a[1], (a[2] as usize).min(128)),
            _ => None,
        };
        self.task(tid).pending = Some(Pending {
            nr: r.nr,
            args: a,
            entry,
        });
        true
    }

    /// Syscall-exit stop: read what the kernel wrote back, decode and log.
    fn on_exit(&mut self, tid: i32) {
        let Some(p) = self.task(tid).pending.take() else {
            return;
        };
        let tgid = self.task(tid).tgid;
        let ret = arch::regs(tid).map(|r| r.ret).unwrap_or(-1);
        let a = p.args;
        let written = |lenp: u64, buf: u64, max: u32| {
            let len = read_mem(tid, lenp, 4)
                .filter(|b| b.len() == 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))?;
            let bytes = if ret >= 0 {
                read_mem(tid, buf, len.min(max) as usize)
            } else {
                None
            };
            Some((len, bytes))
        };
        let back = match p.nr {
            nr::ACCEPT | nr::ACCEPT4 if a[1] != 0 => written(a[2], a[1], 128),
            nr::GETSOCKOPT => written(a[4], a[3], 256),
            _ => None,
        };
        let mut c = self.call(tid, tgid, p.nr, a);
        c.ret = Some(ret);
        c.entry = p.entry;
        c.back = back;
        self.book.on_call(&c);
    }

    /// A new task from fork/vfork/clone: a forked process gets a copy of its parent's
    /// descriptor table.
    fn on_new_task(&mut self, parent: i32, child: i32) {
        let ptgid = self.task(parent).tgid;
        let ctgid = self.task(child).tgid;
        self.book.on_fork(ptgid, ctgid);
    }
}

/// Runs `cmd` (program and arguments) under the seccomp + ptrace recorder until it and every
/// process it started have exited. CMD's stdin/stdout/stderr are ours.
pub(super) fn record(cmd: &[String], opts: RecordOptions) -> Result<Recording, RecordError> {
    let (prog, rest) = cmd.split_first().ok_or(RecordError::NoCommand)?;
    let start = Instant::now();
    let child = spawn_traced(prog, rest, opts.trace_close)?;
    let main = child.id() as i32;
    raise_tracer_priority();
    attach(main)?;
    let mut t = Tracer {
        start,
        book: Book::new(opts),
        tasks: HashMap::new(),
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
    let tasks = t.seen_tasks;
    let mut rec = t.book.finish(cmd.to_vec());
    rec.exit_code = exit_code;
    rec.signal = signal;
    rec.tasks = tasks;
    rec.mechanism = "ptrace".into();
    Ok(rec)
}

/// Starts CMD traced from its first instruction: PTRACE_TRACEME, no new privileges, and the
/// seccomp filter that stops it only at the socket calls.
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
