//! The BPF recorder: bpf/record.bpf.c (built by build.rs with clang, CO-RE against the
//! kernel's BTF) on the `syscalls:sys_enter_*`/`sys_exit_*` tracepoints of the recorded
//! calls and on `sched:sched_process_fork`/`sched_process_exit` (BTF tracepoints), loaded
//! with aya. The kernel side keeps only the calls of the traced processes (a hash of
//! thread-group ids that grows on fork) and sends one event per completed call through a
//! ring buffer; here they are decoded by the same [`Book`] as the ptrace recorder's.
//! Nothing stops the traced program: the cost per call is a map lookup, a copy of the
//! option value and a ring-buffer record.

use std::time::Duration;

use super::{RecordError, RecordOptions, Recording};

/// How the build went: `built`, or `not built: <why>`.
pub const BUILD: &str = env!("LAGTRACE_BPF_BUILD");

#[cfg(lagtrace_bpf)]
mod imp {
    use std::collections::BTreeSet;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use aya::maps::{Array, HashMap, MapData, RingBuf};
    use aya::programs::{BtfTracePoint, TracePoint};
    use aya::{Btf, Ebpf, EbpfLoader};
    use lagtrace_model::{Capability, Privilege};

    use super::super::book::{Book, Call};
    use super::super::nr;
    use super::*;

    const EV_CALL: u32 = 1;
    const EV_FORK: u32 = 2;
    const EV_EXIT: u32 = 3;
    const EV_THREAD: u32 = 4;
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
        fn call(&self, start_ns: u64) -> Call {
            let nr = u64::from(self.nr);
            let a = self.args;
            let bytes = (self.len > 0).then(|| self.data.clone());
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
        fn on_event(&mut self, ev: &RawEvent) {
            match ev.kind {
                EV_CALL => self.book.on_call(&ev.call(self.start_ns)),
                EV_FORK => {
                    self.book.on_fork(ev.tgid, ev.nr);
                    self.live.insert(ev.nr);
                    self.tasks += 1;
                }
                EV_THREAD => self.tasks += 1,
                EV_EXIT => {
                    self.live.remove(&ev.tgid);
                }
                _ => {}
            }
        }
    }

    static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/record.bpf.o"));

    /// The syscall tracepoints: (program, tracepoint under `syscalls`).
    const SYSCALL_TPS: [&str; 25] = [
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
        // exits (no exit program for close: it is reported at entry)
        "x:socket",
        "x:bind",
        "x:listen",
        "x:connect",
        "x:accept",
        "x:accept4",
        "x:setsockopt",
        "x:getsockopt",
        "x:dup",
        "x:dup2",
        "x:dup3",
        "x:fcntl",
    ];

    /// The loaded, attached recorder (detached when dropped).
    pub struct Recorder {
        _ebpf: Ebpf,
        events: RingBuf<MapData>,
        tgids: HashMap<MapData, u32, u8>,
        config: Array<MapData, u32>,
        lost: Array<MapData, u64>,
    }

    fn refused(what: &str, e: &(dyn std::error::Error + 'static)) -> RecordError {
        let mut cur = Some(e);
        while let Some(err) = cur {
            // The verifier refuses with EACCES too: that is not a missing capability.
            if let Some(aya::programs::ProgramError::LoadError { verifier_log, .. }) =
                err.downcast_ref::<aya::programs::ProgramError>()
            {
                let log = verifier_log.to_string();
                let last = log
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty() && !l.starts_with("processed"))
                    .unwrap_or("");
                return RecordError::Bpf(format!("{what}: the verifier refused it: {last}"));
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if let Some(libc::EPERM | libc::EACCES) = io.raw_os_error() {
                    let p = Privilege::new(Capability::Bpf, what, " and CAP_PERFMON");
                    return RecordError::Privilege(p);
                }
            }
            cur = err.source();
        }
        RecordError::Bpf(format!("{what}: {e}"))
    }

    fn map<T>(ebpf: &mut Ebpf, name: &str) -> Result<T, RecordError>
    where
        T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = ebpf
            .take_map(name)
            .ok_or_else(|| RecordError::Bpf(format!("no {name} map in the object")))?;
        T::try_from(m).map_err(|e| RecordError::Bpf(format!("map {name}: {e}")))
    }

    fn attach_syscalls(ebpf: &mut Ebpf) -> Result<(), RecordError> {
        let what = "loading the socket-call recorder (BPF)";
        for tp in SYSCALL_TPS {
            let (prog, event) = match tp.strip_prefix("x:") {
                Some(name) => (format!("exit_{name}"), format!("sys_exit_{name}")),
                None => (format!("enter_{tp}"), format!("sys_enter_{tp}")),
            };
            let p: &mut TracePoint = ebpf
                .program_mut(&prog)
                .ok_or_else(|| RecordError::Bpf(format!("no {prog} program in the object")))?
                .try_into()
                .map_err(|e| refused(what, &e))?;
            p.load().map_err(|e| refused(what, &e))?;
            p.attach("syscalls", &event)
                .map_err(|e| refused(&format!("attaching to syscalls:{event}"), &e))?;
        }
        Ok(())
    }

    fn attach_sched(ebpf: &mut Ebpf) -> Result<(), RecordError> {
        let btf = Btf::from_sys_fs().map_err(|e| {
            RecordError::Bpf(format!("the kernel's BTF (needed to follow forks): {e}"))
        })?;
        for (prog, event) in [
            ("on_fork", "sched_process_fork"),
            ("on_exit", "sched_process_exit"),
        ] {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(prog)
                .ok_or_else(|| RecordError::Bpf(format!("no {prog} program in the object")))?
                .try_into()
                .map_err(|e| refused("loading the recorder's fork follower", &e))?;
            p.load(event, &btf)
                .map_err(|e| refused("loading the recorder's fork follower", &e))?;
            p.attach()
                .map_err(|e| refused(&format!("attaching to sched:{event}"), &e))?;
        }
        Ok(())
    }

    impl Recorder {
        /// Loads and attaches the recorder; it traces nothing until given processes.
        pub fn load(trace_close: bool) -> Result<Recorder, RecordError> {
            let what = "loading the socket-call recorder (BPF)";
            let mut ebpf = EbpfLoader::new().load(OBJ).map_err(|e| refused(what, &e))?;
            let mut config: Array<MapData, u32> = map(&mut ebpf, "CONFIG")?;
            config
                .set(1, u32::from(trace_close), 0)
                .map_err(|e| refused(what, &e))?;
            attach_syscalls(&mut ebpf)?;
            attach_sched(&mut ebpf)?;
            Ok(Recorder {
                events: map(&mut ebpf, "EVENTS")?,
                tgids: map(&mut ebpf, "TGIDS")?,
                lost: map(&mut ebpf, "LOST")?,
                config,
                _ebpf: ebpf,
            })
        }

        fn lost_events(&self) -> u64 {
            (0..2).filter_map(|i| self.lost.get(&i, 0).ok()).sum()
        }

        /// Reads every event in the ring buffer, then waits up to `wait` for more.
        fn pump(&mut self, s: &mut Session, wait: Duration) {
            while let Some(item) = self.events.next() {
                if let Some(ev) = RawEvent::parse(&item) {
                    s.on_event(&ev);
                }
            }
            let mut pfd = libc::pollfd {
                fd: self.events.as_raw_fd(),
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
            let set = |c: &mut Array<MapData, u32>, v: u32| {
                c.set(0, v, 0)
                    .map_err(|e| RecordError::Bpf(format!("setting the launcher: {e}")))
            };
            set(&mut self.config, me)?;
            let spawned = std::process::Command::new(prog).args(rest).spawn();
            set(&mut self.config, 0)?;
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
                self.tgids
                    .insert(p, 1, 0)
                    .map_err(|e| refused(&format!("tracing process {p}"), &e))?;
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

/// Without the program (built without clang, bpftool or BTF): never loads.
#[cfg(not(lagtrace_bpf))]
pub struct Recorder(std::convert::Infallible);

#[cfg(not(lagtrace_bpf))]
impl Recorder {
    /// Always an error, with the build's reason.
    pub fn load(_trace_close: bool) -> Result<Recorder, RecordError> {
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
    Recorder::load(opts.trace_close)?.run_cmd(cmd, opts)
}
