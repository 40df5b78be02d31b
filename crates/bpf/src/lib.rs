//! lagtrace-bpf: BPF programs loaded by hand with bpf(2), without a BPF library — the
//! maps an object declares created from a table the caller gives, its programs taken from
//! the ELF object clang wrote with their map references set, loaded (with the verifier's
//! reason when refused) and attached to a tracepoint (perf event) or a kernel function
//! (fentry/fexit trampoline, by its BTF id from [`btf`]); events read from a ring buffer
//! ([`ringbuf`]). The kernel's BTF is never loaded whole: starting costs a few ms.
#![deny(missing_docs)]

pub mod btf;
pub mod ringbuf;
pub mod tracefs;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `BPF_MAP_TYPE_HASH`.
pub const MAP_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
pub const MAP_PERCPU_ARRAY: u32 = 6;
/// `BPF_MAP_TYPE_LRU_HASH`.
pub const MAP_LRU_HASH: u32 = 9;
/// `BPF_MAP_TYPE_RINGBUF`.
pub const MAP_RINGBUF: u32 = 27;
/// `BPF_PROG_TYPE_TRACEPOINT`.
pub const PROG_TRACEPOINT: u32 = 5;
/// `BPF_PROG_TYPE_PERF_EVENT` (a sampling event's overflow).
pub const PROG_PERF_EVENT: u32 = 7;
/// `BPF_MAP_TYPE_STACK_TRACE`.
pub const MAP_STACK_TRACE: u32 = 7;
/// `BPF_PROG_TYPE_RAW_TRACEPOINT`.
pub const PROG_RAW_TRACEPOINT: u32 = 17;
/// `BPF_PROG_TYPE_TRACING` (fentry/fexit).
pub const PROG_TRACING: u32 = 26;
/// `BPF_TRACE_FENTRY`.
pub const TRACE_FENTRY: u32 = 24;
/// `BPF_TRACE_FEXIT`.
pub const TRACE_FEXIT: u32 = 25;

const BPF_MAP_CREATE: i64 = 0;
const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_GET_NEXT_KEY: i64 = 4;
const BPF_PROG_LOAD: i64 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;
const PSEUDO_MAP_FD: u8 = 1;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// Why a map or program could not be made or attached.
#[derive(Debug)]
pub enum Error {
    /// The kernel refused for lack of privilege (EPERM/EACCES): CAP_BPF, CAP_PERFMON.
    Denied(String, io::Error),
    /// The verifier refused the program: its last line.
    Verifier(String, String),
    /// Anything else (no such function or tracepoint, malformed object, old kernel).
    Kernel(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Denied(what, e) => write!(f, "{what}: {e}"),
            Error::Verifier(what, last) => write!(f, "{what}: the verifier refused it: {last}"),
            Error::Kernel(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// `what` failed with `e`: denied when it is EPERM or EACCES.
    pub fn os(what: impl Into<String>, e: io::Error) -> Error {
        let what = what.into();
        match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => Error::Denied(what, e),
            _ => Error::Kernel(format!("{what}: {e}")),
        }
    }
}

fn sys_bpf(cmd: i64, attr: &mut [u8]) -> io::Result<i32> {
    // SAFETY: attr is a zero-padded `union bpf_attr` prefix of the length passed; every
    // pointer in it points to memory that lives for the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

fn fd(rc: i32) -> OwnedFd {
    // SAFETY: rc is a descriptor the kernel just returned to us.
    unsafe { OwnedFd::from_raw_fd(rc) }
}

fn put(a: &mut [u8], off: usize, v: &[u8]) {
    a[off..off + v.len()].copy_from_slice(v);
}

/// A map as the object declares it: name, type, key and value size, entries.
pub type MapSpec = (&'static str, u32, u32, u32, u32);

/// Whether `maps` — the loader's copy of an object's map declarations — says what the
/// object's BTF declares, map by map (the verifier refuses a program whose map value is
/// smaller than the C struct it writes, with a message naming a register, not the map).
pub fn check_maps(obj: &[u8], maps: &[MapSpec]) -> Result<(), String> {
    let o = Object::parse(obj).map_err(|e| e.to_string())?;
    let b = o.btf().ok_or("the object has no BTF")?;
    let defs = btf::Btf::parse(b)
        .and_then(|b| b.map_defs())
        .map_err(|e| e.0)?;
    for m in maps {
        let d = defs
            .iter()
            .find(|d| d.0 == m.0)
            .ok_or_else(|| format!("map {} is not in the object", m.0))?;
        if (d.1, d.2, d.3, d.4) != (m.1, m.2, m.3, m.4) {
            return Err(format!(
                "map {}: the object declares type {}, key {} B, value {} B, {} entries; the \
                 loader says type {}, key {} B, value {} B, {} entries",
                m.0, d.1, d.2, d.3, d.4, m.1, m.2, m.3, m.4
            ));
        }
    }
    match defs.iter().find(|d| !maps.iter().any(|m| m.0 == d.0)) {
        Some(d) => Err(format!(
            "map {} of the object is not in the loader's list",
            d.0
        )),
        None => Ok(()),
    }
}

/// Creates a map.
pub fn map_create(m: &MapSpec) -> Result<OwnedFd, Error> {
    let (name, ty, key, value, entries) = *m;
    let mut a = [0u8; 72];
    for (i, v) in [ty, key, value, entries].iter().enumerate() {
        put(&mut a, 4 * i, &v.to_ne_bytes());
    }
    let n = name.as_bytes();
    put(&mut a, 28, &n[..n.len().min(15)]);
    sys_bpf(BPF_MAP_CREATE, &mut a)
        .map(fd)
        .map_err(|e| Error::os(format!("creating BPF map {name}"), e))
}

/// lookup / update / next-key: map fd, key, value (or next key).
fn map_op(cmd: i64, map: &OwnedFd, key: *const u8, val: *mut u8) -> io::Result<()> {
    let mut a = [0u8; 32];
    put(&mut a, 0, &map.as_raw_fd().to_ne_bytes());
    put(&mut a, 8, &(key as u64).to_ne_bytes());
    put(&mut a, 16, &(val as u64).to_ne_bytes());
    sys_bpf(cmd, &mut a).map(|_| ())
}

/// Sets `key` to `value` (their sizes must be the map's).
pub fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    map_op(
        BPF_MAP_UPDATE_ELEM,
        map,
        key.as_ptr(),
        value.as_ptr().cast_mut(),
    )
}

/// Reads `key`'s value into `value` (sized as the map's values; per-CPU maps: times CPUs).
pub fn map_lookup(map: &OwnedFd, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    map_op(BPF_MAP_LOOKUP_ELEM, map, key.as_ptr(), value.as_mut_ptr())
}

/// The key after `key` (the first with `None`) into `next`; `false` at the end.
pub fn map_next_key(map: &OwnedFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let from = key.map_or(std::ptr::null(), |k| k.as_ptr());
    match map_op(BPF_MAP_GET_NEXT_KEY, map, from, next.as_mut_ptr()) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

mod elf;
pub use elf::Object;

/// How to load one program.
#[derive(Debug, Clone, Copy)]
pub struct ProgSpec<'a> {
    /// Its name (for the kernel's listing; up to 15 bytes kept).
    pub name: &'a str,
    /// `PROG_TRACEPOINT` or `PROG_TRACING`.
    pub prog_type: u32,
    /// `TRACE_FENTRY`/`TRACE_FEXIT` for tracing programs, else 0.
    pub attach_type: u32,
    /// The kernel function's BTF id for tracing programs, else 0.
    pub attach_btf_id: u32,
}

/// Loads a program; when refused, asks again with the verifier's log for the reason.
pub fn prog_load(insns: &[u8], license: &[u8], spec: &ProgSpec<'_>) -> Result<OwnedFd, Error> {
    let mut lic = license.to_vec();
    lic.push(0);
    let mut a = [0u8; 128];
    put(&mut a, 0, &spec.prog_type.to_ne_bytes());
    put(&mut a, 4, &((insns.len() / 8) as u32).to_ne_bytes());
    put(&mut a, 8, &(insns.as_ptr() as u64).to_ne_bytes());
    put(&mut a, 16, &(lic.as_ptr() as u64).to_ne_bytes());
    let n = spec.name.as_bytes();
    put(&mut a, 48, &n[..n.len().min(15)]);
    put(&mut a, 68, &spec.attach_type.to_ne_bytes());
    put(&mut a, 108, &spec.attach_btf_id.to_ne_bytes());
    let what = format!("loading BPF program {}", spec.name);
    let first = match sys_bpf(BPF_PROG_LOAD, &mut a) {
        Ok(p) => return Ok(fd(p)),
        Err(e) => e,
    };
    // Again with the verifier's log: it refuses with EACCES too, which is no missing
    // capability.
    let mut log = vec![0u8; 64 * 1024];
    put(&mut a, 24, &1u32.to_ne_bytes());
    put(&mut a, 28, &(log.len() as u32).to_ne_bytes());
    put(&mut a, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
    let again = sys_bpf(BPF_PROG_LOAD, &mut a);
    if let Ok(p) = again {
        return Ok(fd(p));
    }
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)]);
    match text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with("processed"))
    {
        Some(last) => Err(Error::Verifier(what, last.to_string())),
        None => Err(Error::os(what, first)),
    }
}

/// Calls `f(key, value)` for every entry of the hash map `map` (`K`-byte keys, `V`-byte
/// values); an entry deleted while walking is skipped.
pub fn map_for_each<const K: usize, const V: usize>(
    map: &OwnedFd,
    mut f: impl FnMut(&[u8; K], &[u8; V]),
) -> io::Result<()> {
    let mut key = [0u8; K];
    let mut next = [0u8; K];
    let mut first = true;
    while map_next_key(map, (!first).then_some(&key[..]), &mut next)? {
        first = false;
        key = next;
        let mut v = [0u8; V];
        if map_lookup(map, &key, &mut v).is_ok() {
            f(&key, &v);
        }
    }
    Ok(())
}

/// The sum of the first `n` u64 slots of the array map `map` (unreadable slots count 0).
pub fn array_sum(map: &OwnedFd, n: u32) -> u64 {
    (0..n)
        .map(|i| {
            let mut v = [0u8; 8];
            map_lookup(map, &i.to_ne_bytes(), &mut v).map_or(0, |()| u64::from_ne_bytes(v))
        })
        .sum()
}

/// The addresses of stack `id` in the stack-trace map `map` of `depth` frames, innermost
/// first, up to the first 0; `None` when the map has no such stack.
pub fn stack_addrs(map: &OwnedFd, id: i32, depth: usize) -> Option<Vec<u64>> {
    let mut v = vec![0u8; depth * 8];
    map_lookup(map, &(id as u32).to_ne_bytes(), &mut v).ok()?;
    Some(
        v.chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
            .take_while(|&a| a != 0)
            .collect(),
    )
}

/// The native-endian u32 at byte `at` of a map key or value (0 past its end).
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// The native-endian u64 at byte `at` of a map key or value (0 past its end).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Attaches a loaded tracing (fentry/fexit) program to the function it was loaded for; it
/// stays attached while the returned link lives.
pub fn attach_tracing(prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut a = [0u8; 16];
    put(&mut a, 8, &prog.as_raw_fd().to_ne_bytes());
    sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a).map(fd)
}

/// Attaches a loaded raw-tracepoint program to the tracepoint `name` (`sys_exit`); it
/// stays attached while the returned link lives.
pub fn attach_raw_tracepoint(name: &std::ffi::CStr, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut a = [0u8; 16];
    put(&mut a, 0, &(name.as_ptr() as u64).to_ne_bytes());
    put(&mut a, 8, &prog.as_raw_fd().to_ne_bytes());
    sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a).map(fd)
}

/// Opens the tracepoint `tp_id` (one event: a tracepoint program runs on every CPU) and
/// attaches `prog`; detached when the returned event is closed.
pub fn attach_tracepoint(tp_id: u64, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&2u32.to_ne_bytes()); // PERF_TYPE_TRACEPOINT
    attr[8..16].copy_from_slice(&tp_id.to_ne_bytes());
    attr[16..24].copy_from_slice(&1u64.to_ne_bytes());
    attach_perf_event(attr, 0, prog)
}

/// Opens a CPU-clock sampling event on `cpu` (whatever thread runs there) that fires `hz`
/// times a second and attaches `prog` (a perf-event program) to it: the program runs on each
/// sample, in the context of the thread it interrupted. Detached when the event is closed.
pub fn attach_cpu_clock(cpu: i32, hz: u64, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    // config 0: PERF_COUNT_SW_CPU_CLOCK; sample_freq at 16; flags at 40: freq (bit 10).
    attr[16..24].copy_from_slice(&hz.to_ne_bytes());
    attr[40..48].copy_from_slice(&(1u64 << 10).to_ne_bytes());
    attach_perf_event(attr, cpu, prog)
}

/// Opens the perf event `attr` (a `perf_event_attr` prefix; its size is set here) on `cpu`
/// for every process, attaches `prog` and enables it.
fn attach_perf_event(mut attr: [u8; 64], cpu: i32, prog: &OwnedFd) -> io::Result<OwnedFd> {
    attr[4..8].copy_from_slice(&64u32.to_ne_bytes());
    // SAFETY: attr is a valid perf_event_attr of the size it declares.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1,
            cpu,
            -1,
            8 as libc::c_ulong,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let ev = fd(rc as i32);
    // SAFETY: ioctls on our own perf event with a program descriptor / no argument.
    let ok = unsafe {
        libc::ioctl(ev.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) == 0
            && libc::ioctl(ev.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) == 0
    };
    if ok {
        Ok(ev)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes `fds` (programs, their perf events and links) in parallel: detaching a program
/// from a tracepoint waits for an RCU grace period (~60 ms each on a busy machine), and
/// waits that overlap share one.
pub fn detach_all(fds: Vec<OwnedFd>) {
    std::thread::scope(|s| {
        for fd in fds {
            // Without a thread, closed here (in turn).
            let _ = std::thread::Builder::new().spawn_scoped(s, move || drop(fd));
        }
    });
}
