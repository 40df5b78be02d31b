//! The BPF recorder: bpf/record.bpf.c (built by build.rs with clang) loaded by hand with
//! bpf(2) ([`lagtrace_bpf`]: no BPF library, the kernel's BTF read in one pass for the ids
//! of the hooked functions, a few ms). Its hooks, by preference:
//! - `fentry`: fexit trampolines on the syscalls' entry points (`__x64_sys_setsockopt`, …;
//!   close at its entry): one program per call sees its arguments and its result, and only
//!   calls of those functions pay for it;
//! - `tracepoint`: the `syscalls:sys_enter_*`/`sys_exit_*` tracepoints, where trampolines
//!   cannot attach (kernels without them); enabling any syscall tracepoint puts every
//!   syscall of every task on the kernel's tracing slow path;
//! - `raw` (asked for only): one program on the raw `sys_exit` tracepoint that keeps the
//!   recorded calls by number (arguments from the saved registers), no perf record per
//!   call; the same slow path.
//!
//! Forks and exits come from the classic `sched:sched_process_fork`/`sched_process_exit`
//! tracepoints. The kernel side keeps only the calls of the traced processes (a hash of
//! thread-group ids that grows on fork) and sends one event per completed call through a
//! ring buffer, read here in place and decoded by the same [`Book`] as the ptrace
//! recorder's. Nothing stops the traced program.

use std::time::Duration;

use super::{RecordError, RecordOptions, Recording};

/// How the build went: `built`, or `not built: <why>`.
pub const BUILD: &str = env!("LAGTRACE_BPF_BUILD");

#[cfg(lagtrace_bpf)]
mod imp {
    use std::collections::BTreeSet;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use lagtrace_bpf::btf::{Btf, VMLINUX, Vmlinux};
    use lagtrace_bpf::ringbuf::RingBuf;
    use lagtrace_bpf::tracefs::{self, Format};
    use lagtrace_bpf::{
        Error, MAP_ARRAY, MAP_HASH, MAP_PERCPU_ARRAY, MAP_RINGBUF, MapSpec, Object,
        PROG_RAW_TRACEPOINT, PROG_TRACEPOINT, PROG_TRACING, ProgSpec, TRACE_FENTRY, TRACE_FEXIT,
    };
    use lagtrace_model::{Capability, Privilege};

    use super::super::book::{Book, Call};
    use super::super::{Hooks, nr};
    use super::*;

    const EV_CALL: u32 = 1;
    const EV_FORK: u32 = 2;
    const EV_EXIT: u32 = 3;
    /// Size of `struct event` in record.bpf.c, and where its fields are.
    const EVENT_LEN: usize = 216;
    const DATA_AT: usize = 88;

    /// One ring-buffer record, decoded from `struct event`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct RawEvent {
        time_ns: u64,
        kind: u32,
        tgid: u32,
        tid: u32,
        nr: u32,
        ret: i64,
        args: [u64; 6],
        len: u32,
        len2: u32,
        data: Vec<u8>,
    }

    impl RawEvent {
        fn parse(b: &[u8]) -> Option<RawEvent> {
            if b.len() < EVENT_LEN {
                return None;
            }
            let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let u64_at = |i: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b[i..i + 8]);
                u64::from_ne_bytes(w)
            };
            let mut args = [0u64; 6];
            for (i, a) in args.iter_mut().enumerate() {
                *a = u64_at(32 + 8 * i);
            }
            let len = u32_at(80);
            let data_len = (len as usize).min(EVENT_LEN - DATA_AT);
            Some(RawEvent {
                time_ns: u64_at(0),
                kind: u32_at(8),
                tgid: u32_at(12),
                tid: u32_at(16),
                nr: u32_at(20),
                ret: u64_at(24) as i64,
                args,
                len,
                len2: u32_at(84),
                data: b[DATA_AT..DATA_AT + data_len].to_vec(),
            })
        }

        /// The call it reports, for the shared decoder.
        fn call(self, start_ns: u64) -> Call {
            let nr = u64::from(self.nr);
            let a = self.args;
            let bytes = (self.len > 0).then_some(self.data);
            let (entry, back) = match nr {
                nr::SETSOCKOPT | nr::BIND | nr::CONNECT => (bytes, None),
                nr::ACCEPT | nr::ACCEPT4 if a[1] != 0 && a[2] != 0 && self.ret >= 0 => {
                    (None, Some((self.len2, bytes)))
                }
                nr::GETSOCKOPT if a[4] != 0 && self.ret >= 0 => (None, Some((self.len2, bytes))),
                _ => (None, None),
            };
            Call {
                tid: self.tid,
                tgid: self.tgid,
                time_us: self.time_ns.saturating_sub(start_ns) / 1000,
                nr,
                args: a,
                ret: (nr != nr::CLOSE).then_some(self.ret),
                entry,
                back,
            }
        }
    }

    /// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
    fn monotonic_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Whether process `pid` is gone (or a zombie: it runs no more code).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => s
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
            Err(_) => true,
        }
    }

    /// `pids` and every live descendant of theirs (from /proc/*/stat's parent pids).
    fn with_descendants(pids: &[u32]) -> BTreeSet<u32> {
        let mut parent_of = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let ppid = stat
                    .rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                if let Some(ppid) = ppid {
                    parent_of.push((pid, ppid));
                }
            }
        }
        let mut set: BTreeSet<u32> = pids.iter().copied().collect();
        loop {
            let before = set.len();
            for &(pid, ppid) in &parent_of {
                if set.contains(&ppid) {
                    set.insert(pid);
                }
            }
            if set.len() == before {
                return set;
            }
        }
    }

    fn threads_of(pid: u32) -> usize {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(1)
    }

    /// What a loop over the events tracks besides the book.
    struct Session {
        book: Book,
        start_ns: u64,
        /// Traced processes still running.
        live: BTreeSet<u32>,
        tasks: usize,
    }

    impl Session {
        fn on_event(&mut self, ev: RawEvent) {
            match ev.kind {
                EV_CALL => self.book.on_call(&ev.call(self.start_ns)),
                EV_FORK => {
                    self.tasks += 1;
                    // The fork record does not say whether the new task is a thread: a
                    // thread is listed under its process (one that has exited already
                    // counts as a process and leaves `live` at the next check).
                    let thread =
                        std::path::Path::new(&format!("/proc/{}/task/{}", ev.tgid, ev.nr)).exists();
                    if !thread {
                        self.book.on_fork(ev.tgid, ev.nr);
                        self.live.insert(ev.nr);
                    }
                }
                EV_EXIT => {
                    self.live.remove(&ev.tgid);
                }
                _ => {}
            }
        }
    }

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/record.bpf.o"));

    const RING_BYTES: u32 = 8 << 20;
    const PENDING_LEN: u32 = 192;

    /// The maps record.bpf.c uses (PENDING/SCRATCH: `pending` entries for the tracepoint
    /// hooks, sized by [`maps`]).
    const MAPS: [MapSpec; 4] = [
        ("TGIDS", MAP_HASH, 4, 1, 16384),
        ("CONFIG", MAP_ARRAY, 4, 4, 2),
        ("EVENTS", MAP_RINGBUF, 0, 0, RING_BYTES),
        ("LOST", MAP_ARRAY, 4, 8, 2),
    ];

    /// The list above says what the object declares (a struct grown in the C source and not
    /// here is refused by the verifier with a message about a register).
    #[cfg(test)]
    #[test]
    fn maps_agree_with_the_object() {
        // PENDING's entries are sized when loading ([`maps`]); the object declares 16384.
        let all: Vec<MapSpec> = MAPS
            .iter()
            .copied()
            .chain([
                ("PENDING", MAP_HASH, 4, PENDING_LEN, 16384),
                ("SCRATCH", MAP_PERCPU_ARRAY, 4, PENDING_LEN, 1),
            ])
            .collect();
        lagtrace_bpf::check_maps(OBJ, &all).unwrap();
    }

    /// The fexit programs: (call, its kernel entry point's section suffix); close is an
    /// fentry (reported at entry).
    const FEXITS: [&str; 12] = [
        "socket",
        "bind",
        "listen",
        "connect",
        "accept",
        "accept4",
        "setsockopt",
        "getsockopt",
        "dup",
        "dup2",
        "dup3",
        "fcntl",
    ];

    /// The syscall tracepoints with an entry program (every one but close has an exit
    /// program too; fcntl's entry keeps only F_DUPFD).
    const SYSCALL_TPS: [&str; 13] = [
        "socket",
        "bind",
        "listen",
        "connect",
        "accept",
        "accept4",
        "setsockopt",
        "getsockopt",
        "close",
        "dup",
        "dup2",
        "dup3",
        "fcntl",
    ];

    /// The loaded, attached recorder (detached when dropped).
    pub struct Recorder {
        events: RingBuf,
        tgids: OwnedFd,
        config: OwnedFd,
        lost: OwnedFd,
        hooks: Hooks,
        /// Why the preferred hooks were not used.
        fallback: Option<String>,
        /// Programs and their attachments (links, perf events).
        attached: Vec<OwnedFd>,
    }

    impl Drop for Recorder {
        fn drop(&mut self) {
            lagtrace_bpf::detach_all(std::mem::take(&mut self.attached));
        }
    }

    fn refused(e: Error) -> RecordError {
        match e {
            Error::Denied(what, _) => {
                RecordError::Privilege(Privilege::new(Capability::Bpf, &what, " and CAP_PERFMON"))
            }
            e => RecordError::Bpf(e.to_string()),
        }
    }

    /// The maps, by name; `pending` entries in PENDING (1 when the tracepoint hooks, its
    /// only writers, are not used).
    fn maps(pending: u32) -> Result<Vec<(&'static str, OwnedFd)>, Error> {
        let mut out = Vec::new();
        for m in MAPS.iter().chain(&[
            ("PENDING", MAP_HASH, 4, PENDING_LEN, pending),
            ("SCRATCH", MAP_PERCPU_ARRAY, 4, PENDING_LEN, 1),
        ]) {
            out.push((m.0, lagtrace_bpf::map_create(m)?));
        }
        Ok(out)
    }

    /// Loads the program in `section` of the object.
    fn load_prog(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
        section: &str,
        spec: &ProgSpec<'_>,
    ) -> Result<OwnedFd, Error> {
        let fds: Vec<(&str, i32)> = maps.iter().map(|(n, f)| (*n, f.as_raw_fd())).collect();
        let insns = obj.program(section, &fds)?;
        lagtrace_bpf::prog_load(&insns, obj.license()?, spec)
    }

    /// The fexit/fentry programs on the syscalls' kernel entry points, attached.
    fn attach_fentry(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
    ) -> Result<Vec<OwnedFd>, Error> {
        let funcs: Vec<String> = FEXITS
            .iter()
            .chain(&["close"])
            .map(|c| format!("__x64_sys_{c}"))
            .collect();
        let names: Vec<&str> = funcs.iter().map(String::as_str).collect();
        let btf = Vmlinux::open().map_err(|e| Error::Kernel(format!("{VMLINUX}: {e}")))?;
        let ids = Btf::parse(btf.bytes())
            .map_err(|e| Error::Kernel(e.to_string()))?
            .funcs(&names);
        let mut out = Vec::new();
        for (i, (func, id)) in names.iter().zip(ids).enumerate() {
            let id = match id {
                Some((id, 1)) => id,
                Some((_, n)) => {
                    return Err(Error::Kernel(format!(
                        "{func} takes {n} arguments, not the saved registers"
                    )));
                }
                None => return Err(Error::Kernel(format!("no {func} in the kernel's BTF"))),
            };
            let close = i == FEXITS.len();
            let section = format!("{}/{func}", if close { "fentry" } else { "fexit" });
            let spec = ProgSpec {
                name: func.trim_start_matches("__x64_"),
                prog_type: PROG_TRACING,
                attach_type: if close { TRACE_FENTRY } else { TRACE_FEXIT },
                attach_btf_id: id,
            };
            let prog = load_prog(obj, maps, &section, &spec)?;
            let link = lagtrace_bpf::attach_tracing(&prog)
                .map_err(|e| Error::os(format!("attaching to {func}"), e))?;
            out.extend([prog, link]);
        }
        Ok(out)
    }

    /// The program on the raw `sys_exit` tracepoint, attached.
    fn attach_raw(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
    ) -> Result<Vec<OwnedFd>, Error> {
        let spec = ProgSpec {
            name: "raw_exit",
            prog_type: PROG_RAW_TRACEPOINT,
            attach_type: 0,
            attach_btf_id: 0,
        };
        let prog = load_prog(obj, maps, "raw_tracepoint/sys_exit", &spec)?;
        let link = lagtrace_bpf::attach_raw_tracepoint(c"sys_exit", &prog)
            .map_err(|e| Error::os("attaching to the raw sys_exit tracepoint", e))?;
        Ok(vec![prog, link])
    }

    /// A tracepoint program, loaded and attached to `group:name`.
    fn attach_tp(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
        section: &str,
        (group, name): (&str, &str),
    ) -> Result<Vec<OwnedFd>, Error> {
        let id = tracefs::id(group, name).map_err(|e| Error::os(format!("{group}:{name}"), e))?;
        let spec = ProgSpec {
            name: &name[..name.len().min(15)],
            prog_type: PROG_TRACEPOINT,
            attach_type: 0,
            attach_btf_id: 0,
        };
        let prog = load_prog(obj, maps, section, &spec)?;
        let ev = lagtrace_bpf::attach_tracepoint(id, &prog)
            .map_err(|e| Error::os(format!("attaching to {group}:{name}"), e))?;
        Ok(vec![prog, ev])
    }

    fn attach_syscall_tps(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
    ) -> Result<Vec<OwnedFd>, Error> {
        let mut out = Vec::new();
        for call in SYSCALL_TPS {
            for dir in ["enter", "exit"] {
                if call == "close" && dir == "exit" {
                    continue;
                }
                let name = format!("sys_{dir}_{call}");
                let section = format!("tracepoint/syscalls/{name}");
                out.extend(attach_tp(obj, maps, &section, ("syscalls", &name))?);
            }
        }
        Ok(out)
    }

    /// The fork and exit programs, for the record layouts this kernel has.
    fn attach_sched(
        obj: &Object<'_>,
        maps: &[(&'static str, OwnedFd)],
    ) -> Result<Vec<OwnedFd>, Error> {
        let layout = |name: &str| {
            Format::of("sched", name).map_err(|e| Error::os(format!("sched:{name}"), e))
        };
        let fork = match layout("sched_process_fork")?.field("child_pid") {
            Some((20, 4)) => "20",
            Some((44, 4)) => "44",
            other => {
                return Err(Error::Kernel(format!(
                    "sched:sched_process_fork has child_pid at {other:?}, not where the \
                     recorder reads it"
                )));
            }
        };
        let exit = match layout("sched_process_exit")?.field("group_dead") {
            Some((32, 1)) => "32",
            None => "none",
            Some(other) => {
                return Err(Error::Kernel(format!(
                    "sched:sched_process_exit has group_dead at {other:?}"
                )));
            }
        };
        let mut out = attach_tp(
            obj,
            maps,
            &format!("tracepoint/sched/sched_process_fork/{fork}"),
            ("sched", "sched_process_fork"),
        )?;
        out.extend(attach_tp(
            obj,
            maps,
            &format!("tracepoint/sched/sched_process_exit/{exit}"),
            ("sched", "sched_process_exit"),
        )?);
        Ok(out)
    }

    fn take(maps: &mut Vec<(&'static str, OwnedFd)>, name: &str) -> Result<OwnedFd, RecordError> {
        let i = maps
            .iter()
            .position(|m| m.0 == name)
            .ok_or_else(|| RecordError::Bpf(format!("no {name} map")))?;
        Ok(maps.swap_remove(i).1)
    }

    impl Recorder {
        /// Loads and attaches the recorder with `hooks` (`Auto`: fentry where trampolines
        /// attach, else the syscall tracepoints); it traces nothing until given processes.
        pub fn load(trace_close: bool, hooks: Hooks) -> Result<Recorder, RecordError> {
            let obj = Object::parse(OBJ).map_err(refused)?;
            let mut fallback = None;
            let mut used = Hooks::Fentry;
            let mut attached = Vec::new();
            let mut maps = maps(1).map_err(refused)?;
            if hooks == Hooks::Auto || hooks == Hooks::Fentry {
                // Some kernels refuse trampolines with EPERM even to root with every
                // capability: a refusal is a reason to try the tracepoints, which then
                // tell whether privilege is missing.
                match attach_fentry(&obj, &maps) {
                    Ok(a) => attached = a,
                    Err(e) if hooks == Hooks::Fentry => {
                        return Err(RecordError::Bpf(format!("fentry hooks: {e}")));
                    }
                    Err(e) => fallback = Some(format!("fentry refused: {e}")),
                }
            }
            if hooks == Hooks::Raw {
                used = Hooks::Raw;
                attached = attach_raw(&obj, &maps).map_err(refused)?;
            }
            if attached.is_empty() {
                used = Hooks::Tracepoint;
                maps = self::maps(16384).map_err(refused)?;
                attached = attach_syscall_tps(&obj, &maps).map_err(refused)?;
            }
            attached.extend(attach_sched(&obj, &maps).map_err(refused)?);
            let config = take(&mut maps, "CONFIG")?;
            let set_close = [1u32.to_ne_bytes(), u32::from(trace_close).to_ne_bytes()];
            lagtrace_bpf::map_update(&config, &set_close[0], &set_close[1])
                .map_err(|e| refused(Error::os("configuring the recorder", e)))?;
            let events = RingBuf::new(take(&mut maps, "EVENTS")?, RING_BYTES as usize)
                .map_err(|e| RecordError::Bpf(format!("mapping its ring buffer: {e}")))?;
            let tgids = take(&mut maps, "TGIDS")?;
            let lost = take(&mut maps, "LOST")?;
            // PENDING and SCRATCH live as long as the programs that use them.
            attached.extend(maps.into_iter().map(|m| m.1));
            Ok(Recorder {
                events,
                tgids,
                lost,
                config,
                hooks: used,
                fallback,
                attached,
            })
        }

        fn lost_events(&self) -> u64 {
            (0..2u32)
                .filter_map(|i| {
                    let mut v = [0u8; 8];
                    lagtrace_bpf::map_lookup(&self.lost, &i.to_ne_bytes(), &mut v).ok()?;
                    Some(u64::from_ne_bytes(v))
                })
                .sum()
        }

        /// Reads every event in the ring buffer, then waits up to `wait` for more.
        fn pump(&mut self, s: &mut Session, wait: Duration) {
            self.events.drain(|item| {
                if let Some(ev) = RawEvent::parse(item) {
                    s.on_event(ev);
                }
            });
            let mut pfd = libc::pollfd {
                fd: self.events.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the ring buffer's descriptor.
            unsafe { libc::poll(&raw mut pfd, 1, wait.as_millis() as i32) };
        }

        fn session(opts: RecordOptions) -> Session {
            Session {
                book: Book::new(opts),
                start_ns: monotonic_ns(),
                live: BTreeSet::new(),
                tasks: 0,
            }
        }

        fn finish(mut self, mut s: Session, command: Vec<String>) -> Recording {
            // Events submitted before the end are in the buffer by now.
            self.pump(&mut s, Duration::ZERO);
            let lost = self.lost_events();
            let tasks = s.tasks;
            let mut rec = s.book.finish(command);
            rec.tasks = tasks;
            rec.mechanism = "bpf".into();
            rec.hooks = Some(self.hooks.name().into());
            rec.fallback = self.fallback.take();
            rec.lost_events = lost;
            rec
        }

        /// Starts CMD with the kernel told to trace the child this thread forks, and
        /// records until it and every process it started have exited.
        pub fn run_cmd(
            mut self,
            cmd: &[String],
            opts: RecordOptions,
        ) -> Result<Recording, RecordError> {
            let (prog, rest) = cmd.split_first().ok_or(RecordError::NoCommand)?;
            let mut s = Self::session(opts);
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() } as u32;
            let set = |c: &OwnedFd, v: u32| {
                lagtrace_bpf::map_update(c, &0u32.to_ne_bytes(), &v.to_ne_bytes())
                    .map_err(|e| RecordError::Bpf(format!("setting the launcher: {e}")))
            };
            set(&self.config, me)?;
            let spawned = std::process::Command::new(prog).args(rest).spawn();
            set(&self.config, 0)?;
            let mut child = spawned.map_err(|err| RecordError::Spawn {
                cmd: prog.clone(),
                err,
            })?;
            s.live.insert(child.id());
            s.tasks = 1;
            let mut status = None;
            let mut last_check = Instant::now();
            loop {
                self.pump(&mut s, Duration::from_millis(50));
                if status.is_none() {
                    status = child.try_wait().ok().flatten();
                    if status.is_some() {
                        s.live.remove(&child.id());
                    }
                }
                if status.is_some() && last_check.elapsed() > Duration::from_millis(200) {
                    // Exits whose events were lost: no process left to wait for.
                    s.live.retain(|&p| !gone(p));
                    last_check = Instant::now();
                }
                if status.is_some() && s.live.is_empty() {
                    break;
                }
            }
            let mut rec = self.finish(s, cmd.to_vec());
            if let Some(st) = status {
                use std::os::unix::process::ExitStatusExt;
                rec.exit_code = st.code();
                rec.signal = st.signal();
            }
            Ok(rec)
        }

        /// Traces running processes (with their descendants) for `window`.
        pub fn run_pids(
            mut self,
            pids: &[u32],
            window: Duration,
            mut opts: RecordOptions,
        ) -> Result<Recording, RecordError> {
            let stop = opts.stop.clone();
            let on_attached = opts.on_attached.take();
            let mut s = Self::session(opts);
            for p in with_descendants(pids) {
                lagtrace_bpf::map_update(&self.tgids, &p.to_ne_bytes(), &[1])
                    .map_err(|e| refused(Error::os(format!("tracing process {p}"), e)))?;
                s.live.insert(p);
                s.tasks += threads_of(p);
            }
            if let Some(f) = on_attached {
                f(&s.live.iter().copied().collect::<Vec<_>>());
            }
            let t0 = Instant::now();
            let mut last_check = Instant::now();
            while t0.elapsed() < window && !s.live.is_empty() {
                if stop.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
                    break;
                }
                let left = window.saturating_sub(t0.elapsed());
                self.pump(&mut s, left.min(Duration::from_millis(50)));
                if last_check.elapsed() > Duration::from_millis(200) {
                    s.live.retain(|&p| !gone(p));
                    last_check = Instant::now();
                }
            }
            let mut rec = self.finish(s, Vec::new());
            rec.attached = pids.to_vec();
            Ok(rec)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_an_event() {
            let mut b = vec![0u8; EVENT_LEN];
            b[0..8].copy_from_slice(&5_000_000u64.to_ne_bytes());
            b[8..12].copy_from_slice(&EV_CALL.to_ne_bytes());
            b[12..16].copy_from_slice(&7u32.to_ne_bytes());
            b[16..20].copy_from_slice(&8u32.to_ne_bytes());
            b[20..24].copy_from_slice(&(nr::SETSOCKOPT as u32).to_ne_bytes());
            b[24..32].copy_from_slice(&0i64.to_ne_bytes());
            for (i, v) in [3u64, 6, 1, 0x1000, 4, 0].iter().enumerate() {
                b[32 + 8 * i..40 + 8 * i].copy_from_slice(&v.to_ne_bytes());
            }
            b[80..84].copy_from_slice(&4u32.to_ne_bytes());
            b[DATA_AT..DATA_AT + 4].copy_from_slice(&1i32.to_ne_bytes());
            let ev = RawEvent::parse(&b).unwrap();
            assert_eq!((ev.tgid, ev.tid, ev.len), (7, 8, 4));
            let c = ev.call(1_000_000);
            assert_eq!(c.time_us, 4000);
            assert_eq!(c.ret, Some(0));
            assert_eq!(c.entry.as_deref(), Some(&1i32.to_ne_bytes()[..]));
            assert!(RawEvent::parse(&b[..EVENT_LEN - 1]).is_none());
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::Recorder;

/// Without the program (built without clang or the BPF headers): never loads.
#[cfg(not(lagtrace_bpf))]
pub struct Recorder(std::convert::Infallible);

#[cfg(not(lagtrace_bpf))]
impl Recorder {
    /// Always an error, with the build's reason.
    pub fn load(_trace_close: bool, _hooks: super::Hooks) -> Result<Recorder, RecordError> {
        Err(RecordError::Bpf(format!("the BPF recorder was {BUILD}")))
    }

    /// Never reached.
    pub fn run_cmd(self, _cmd: &[String], _opts: RecordOptions) -> Result<Recording, RecordError> {
        match self.0 {}
    }

    /// Never reached.
    pub fn run_pids(
        self,
        _pids: &[u32],
        _window: Duration,
        _opts: RecordOptions,
    ) -> Result<Recording, RecordError> {
        match self.0 {}
    }
}

/// `-- CMD` on the BPF recorder only.
pub(super) fn record_cmd(cmd: &[String], opts: RecordOptions) -> Result<Recording, RecordError> {
    Recorder::load(opts.trace_close, opts.mechanism.hooks())?.run_cmd(cmd, opts)
}
