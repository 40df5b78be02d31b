//! Where the watched processes' threads are while on a CPU: a CPU-clock sampling event on
//! every CPU (`perf_event_open`, `hz` times a second) runs a BPF program
//! (bpf/oncpu.bpf.c) that keeps a watched process's sample — its kernel stack when it was
//! in the kernel, and its user stack — counted in the kernel by (process, kernel stack,
//! user stack). At the end the kernel frames are named from `/proc/kallsyms` and the user
//! frames with blazesym from the binaries' ELF symbols (`.symtab`, else `.dynsym`) and the
//! process's perf map (`/tmp/perf-PID.map`, which JIT runtimes write on request).
//!
//! Like bcc's `profile` or `perf record -a -g` filtered to the server, aggregated in the
//! kernel. User stacks are walked by frame pointers (the kernel's own unwinder): Debian's
//! binaries and libraries keep none, so a user stack there is its innermost function only —
//! the function that holds the CPU, which is what names the cost ([`OnCpu::user_depth`]
//! says how deep the stacks went). A function is named only where a symbol covers the
//! address; a stripped library is still named by its file ([`Maps`]).

use std::collections::{BTreeMap, HashMap};

use lagtrace_model::host::{FoldedStack, HotFunction, HotModule, OnCpu};

use crate::bpf::BpfError;
use crate::offcpu::Kallsyms;

/// Samples a second on each CPU by default: ~1 000 samples of a busy thread over a 5 s
/// window, a few µs of kernel time each.
pub const DEFAULT_HZ: u64 = 199;
/// Frames kept per stack (kernel and user each).
pub const DEPTH: usize = 24;
/// Modules kept in [`OnCpu::modules`].
const MODULES: usize = 8;
/// Functions kept in [`OnCpu::functions`].
const FUNCTIONS: usize = 12;

/// One frame, named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The file it lies in (`libcrypto.so.3`), `[kernel]`, `[jit]` (anonymous executable
    /// memory), or `[unknown]` (not in the process's maps any more).
    pub module: String,
    /// The function, where a symbol covers the address.
    pub function: Option<String>,
}

impl Frame {
    /// A kernel function.
    pub fn kernel(name: Option<&str>) -> Frame {
        Frame {
            module: "[kernel]".into(),
            function: name.map(str::to_string),
        }
    }

    /// How the folded format writes it: `function_[k]` for the kernel's (FlameGraph's
    /// convention), `module`function` for user code, the module alone without a symbol.
    pub fn folded(&self) -> String {
        let clean = |s: &str| s.replace([';', ' ', '\n'], "_");
        match (&self.function, self.module.as_str()) {
            (Some(f), "[kernel]") => format!("{}_[k]", clean(f)),
            (None, "[kernel]") => "[unknown]_[k]".into(),
            (Some(f), m) => format!("{}`{}", clean(m), clean(f)),
            (None, m) => clean(m),
        }
    }
}

/// One stack of samples, innermost frame first (its kernel frames, then its user frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    /// Its frames.
    pub frames: Vec<Frame>,
    /// Samples.
    pub samples: u64,
}

/// The profile of `stacks` (innermost frame first) sampled at `hz` on `cpus` CPUs: self
/// time by module and by function, and the folded stacks (bounded).
pub fn profile(stacks: &[Stack], hz: u64, cpus: u32, missed: u64, user_depth: u32) -> OnCpu {
    let samples: u64 = stacks.iter().map(|s| s.samples).sum();
    let share = |n: u64| n as f64 / samples.max(1) as f64;
    let mut modules: HashMap<&str, u64> = HashMap::new();
    let mut functions: HashMap<&Frame, u64> = HashMap::new();
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for s in stacks {
        let Some(leaf) = s.frames.first() else {
            continue;
        };
        *modules.entry(leaf.module.as_str()).or_default() += s.samples;
        *functions.entry(leaf).or_default() += s.samples;
        let line: Vec<String> = s.frames.iter().rev().map(Frame::folded).collect();
        *folded.entry(line.join(";")).or_default() += s.samples;
    }
    let mut modules: Vec<HotModule> = modules
        .into_iter()
        .map(|(m, n)| HotModule {
            module: m.to_string(),
            samples: n,
            share: share(n),
        })
        .collect();
    modules.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.module.cmp(&b.module)));
    modules.truncate(MODULES);
    let mut functions: Vec<HotFunction> = functions
        .into_iter()
        .map(|(f, n)| HotFunction {
            function: f.function.clone(),
            module: f.module.clone(),
            samples: n,
            share: share(n),
        })
        .collect();
    functions.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then(a.module.cmp(&b.module))
            .then(a.function.cmp(&b.function))
    });
    functions.truncate(FUNCTIONS);
    let mut folded: Vec<FoldedStack> = folded
        .into_iter()
        .map(|(stack, samples)| FoldedStack { stack, samples })
        .collect();
    folded.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.stack.cmp(&b.stack)));
    let folded_left_out = folded
        .iter()
        .skip(OnCpu::FOLDED_MAX)
        .map(|f| f.samples)
        .sum();
    folded.truncate(OnCpu::FOLDED_MAX);
    let mut p = OnCpu {
        hz,
        cpus,
        samples,
        modules,
        functions,
        folded,
        folded_left_out,
        user_depth,
        missed,
        ..OnCpu::default()
    };
    p.hint = hint(&p);
    p
}

/// What would name the frames a runtime keeps opaque, when they hold a fifth of the samples
/// or more: an interpreter's loop (the script's functions are its data) or code a JIT
/// compiled into anonymous memory that no perf map names.
pub fn hint(p: &OnCpu) -> Option<String> {
    let heavy = |pred: &dyn Fn(&str) -> bool| {
        p.modules
            .iter()
            .filter(|m| pred(&m.module))
            .map(|m| m.share)
            .sum::<f64>()
            >= 0.2
    };
    let python = |m: &str| m.starts_with("python3") || m.starts_with("libpython3");
    if heavy(&python) {
        return Some(
            "the samples are in the Python interpreter, whose frames do not name the script's \
             functions: Python 3.12 or later run with `-X perf` (or PYTHONPERFSUPPORT=1) writes \
             a perf map that lagtrace reads, naming them"
                .into(),
        );
    }
    // Code in anonymous memory that no perf map names (with one, its functions are named).
    let unnamed_jit: f64 = p
        .functions
        .iter()
        .filter(|f| f.module == "[jit]" && f.function.is_none())
        .map(|f| f.share)
        .sum();
    if unnamed_jit >= 0.2 {
        // The node binary, or Debian's build, which keeps V8 in libnode.so.N.
        let node = p
            .modules
            .iter()
            .any(|m| m.module == "node" || m.module.starts_with("libnode.so"));
        return Some(if node {
            "the samples are in JavaScript compiled in memory, which has no symbols: start node \
             with --perf-basic-prof (it writes /tmp/perf-PID.map, which lagtrace reads) to name \
             the JavaScript functions"
                .into()
        } else {
            "the samples are in code compiled in memory (a JIT), which has no symbols: have the \
             runtime write a perf map (/tmp/perf-PID.map: node --perf-basic-prof, Java's \
             perf-map-agent, Python 3.12 -X perf) and lagtrace names its functions"
                .into()
        });
    }
    None
}

/// A process's executable mappings (`/proc/PID/maps`): which file an address lies in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maps(Vec<(u64, u64, String)>);

impl Maps {
    /// The executable mappings of a `/proc/PID/maps` text.
    pub fn parse(text: &str) -> Maps {
        let mut v: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let range = f.next()?;
                let perms = f.next()?;
                if !perms.contains('x') {
                    return None;
                }
                let (a, b) = range.split_once('-')?;
                let (a, b) = (
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                );
                // offset, device, inode, then the path (which may hold spaces).
                let path = f.nth(3).map(|first| {
                    let rest: Vec<&str> = f.collect();
                    let mut p = first.to_string();
                    for r in rest {
                        p.push(' ');
                        p.push_str(r);
                    }
                    p
                });
                Some((a, b, module_name(path.as_deref().unwrap_or(""))))
            })
            .collect();
        v.sort_unstable_by_key(|m| m.0);
        Maps(v)
    }

    /// `/proc/PID/maps`, read now (empty when the process is gone).
    pub fn read(pid: u32) -> Maps {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map(|t| Maps::parse(&t))
            .unwrap_or_default()
    }

    /// The module `addr` lies in.
    pub fn module(&self, addr: u64) -> Option<&str> {
        let i = self.0.partition_point(|m| m.0 <= addr);
        let m = self.0.get(i.checked_sub(1)?)?;
        (addr < m.1).then_some(m.2.as_str())
    }
}

/// A mapping's module name: the file's name, `[jit]` for anonymous executable memory, the
/// kernel's own names (`[vdso]`) as they are.
pub fn module_name(path: &str) -> String {
    let path = path.trim().trim_end_matches(" (deleted)");
    if path.is_empty() || path.starts_with("[anon") || path.starts_with("/memfd:") {
        return "[jit]".into();
    }
    if path.starts_with('[') {
        return path.to_string();
    }
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// One (process, kernel stack, user stack) count as the kernel summed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawCount {
    /// Process.
    pub tgid: u32,
    /// Kernel stack id (< 0: the sample was in user mode).
    pub kstack: i32,
    /// User stack id (< 0: none).
    pub ustack: i32,
    /// Samples.
    pub samples: u64,
}

/// Names the samples' stacks: kernel frames from `kallsyms`, user frames by `user` (a
/// process and its addresses, innermost first → their frames). Returns the stacks and the
/// deepest user stack.
pub fn name_stacks(
    counts: &[RawCount],
    stacks: &HashMap<i32, Vec<u64>>,
    kallsyms: &Kallsyms,
    mut user: impl FnMut(u32, &[u64]) -> Vec<Frame>,
) -> (Vec<Stack>, u32) {
    // Each process's user addresses, named once: a return address (every frame but the
    // innermost) is looked up one byte back, inside the call that it follows.
    let mut wanted: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for c in counts {
        if let Some(u) = stacks.get(&c.ustack) {
            let w = wanted.entry(c.tgid).or_default();
            w.extend(lookups(u));
        }
    }
    let mut named: HashMap<(u32, u64), Frame> = HashMap::new();
    for (tgid, mut addrs) in wanted {
        addrs.sort_unstable();
        addrs.dedup();
        let frames = user(tgid, &addrs);
        for (a, f) in addrs.into_iter().zip(frames) {
            named.insert((tgid, a), f);
        }
    }
    let mut depth = 0u32;
    let mut out: HashMap<Vec<Frame>, u64> = HashMap::new();
    for c in counts {
        let mut frames: Vec<Frame> = stacks
            .get(&c.kstack)
            .map(|k| k.iter().map(|&a| Frame::kernel(kallsyms.name(a))).collect())
            .unwrap_or_default();
        if let Some(u) = stacks.get(&c.ustack) {
            let ls = lookups(u);
            depth = depth.max(ls.len() as u32);
            frames.extend(ls.iter().map(|a| {
                named.get(&(c.tgid, *a)).cloned().unwrap_or(Frame {
                    module: "[unknown]".into(),
                    function: None,
                })
            }));
        }
        if frames.is_empty() {
            frames.push(Frame {
                module: "[unknown]".into(),
                function: None,
            });
        }
        *out.entry(frames).or_default() += c.samples;
    }
    let mut v: Vec<Stack> = out
        .into_iter()
        .map(|(frames, samples)| Stack { frames, samples })
        .collect();
    v.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.frames.cmp(&b.frames)));
    (v, depth)
}

/// The addresses to look up for a user stack: the innermost as it is, the return addresses
/// one byte back.
fn lookups(u: &[u64]) -> Vec<u64> {
    u.iter()
        .take_while(|&&a| a != 0)
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

/// The user frames of process `tgid` at `addrs` (sorted), named with `sym`: a function
/// where an ELF symbol or perf-map entry covers the address, the module from the process's
/// maps always.
pub fn symbolize_user(
    sym: &blazesym::symbolize::Symbolizer,
    tgid: u32,
    addrs: &[u64],
) -> Vec<Frame> {
    use blazesym::symbolize::source::{Process, Source};
    use blazesym::symbolize::{Input, Symbolized};
    let maps = Maps::read(tgid);
    let module_of = |a: u64| maps.module(a).unwrap_or("[unknown]").to_string();
    let src = Source::Process(Process::new(blazesym::Pid::from(tgid)));
    let named = sym
        .symbolize(&src, Input::AbsAddr(addrs))
        .unwrap_or_default();
    addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| match named.get(i) {
            // The maps name the module (a perf map's symbol lies in anonymous memory:
            // `[jit]`); blazesym's own module only where the maps have none.
            Some(Symbolized::Sym(s)) => Frame {
                module: maps.module(a).map(str::to_string).unwrap_or_else(|| {
                    s.module
                        .as_deref()
                        .map_or_else(|| module_of(a), |m| module_name(&m.to_string_lossy()))
                }),
                function: Some(s.name.to_string()),
            },
            _ => Frame {
                module: module_of(a),
                function: None,
            },
        })
        .collect()
}

/// The online CPUs (`/sys/devices/system/cpu/online`: `0-3,6`).
pub fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = parse_cpu_list(&text);
    if v.is_empty() {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
        v = (0..n as i32).collect();
    }
    v
}

/// A kernel CPU list (`0-3,6`).
pub fn parse_cpu_list(text: &str) -> Vec<i32> {
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<i32>().ok()),
        }
    }
    v
}

#[cfg(lagtrace_bpf)]
mod imp {
    use super::*;
    use crate::bpf::{load_program, refused};
    use lagtrace_bpf::{Error, MAP_ARRAY, MAP_HASH, MAP_STACK_TRACE, MapSpec, PROG_PERF_EVENT};
    use lagtrace_bpf::{map_create, map_update, stack_addrs, u32_at, u64_at};
    use std::os::fd::OwnedFd;

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/oncpu.bpf.o"));

    /// The program's maps (as oncpu.bpf.c declares them).
    const MAPS: [MapSpec; 5] = [
        ("WATCH", MAP_HASH, 4, 1, 256),
        ("STACKS", MAP_STACK_TRACE, 4, (DEPTH * 8) as u32, 16384),
        ("SPILL", MAP_STACK_TRACE, 4, (DEPTH * 8) as u32, 4096),
        ("COUNTS", MAP_HASH, 16, 8, 16384),
        ("MISSED", MAP_ARRAY, 4, 8, 2),
    ];

    /// The list above says what the object declares (a struct grown in the C source and not
    /// here is refused by the verifier with a message about a register).
    #[cfg(test)]
    #[test]
    fn maps_agree_with_the_object() {
        lagtrace_bpf::check_maps(OBJ, &MAPS).unwrap();
    }

    /// The mark on a stack id that lives in SPILL, not STACKS (oncpu.bpf.c).
    const SPILL_BIT: i32 = 1 << 24;

    /// What the sampler's maps held at the end of the window.
    struct Collected {
        counts: Vec<RawCount>,
        stacks: HashMap<i32, Vec<u64>>,
        missed: u64,
    }

    /// The sampler while attached (detached when dropped, or when its maps are read).
    pub struct Sampler {
        maps: Vec<(&'static str, OwnedFd)>,
        prog: OwnedFd,
        events: Vec<OwnedFd>,
        hz: u64,
        cpus: u32,
        collected: Option<Collected>,
    }

    impl Sampler {
        /// Loads the program and attaches it to a CPU-clock event on every online CPU,
        /// keeping the samples of the processes `pids` (their every thread).
        pub fn start(pids: &[u32], hz: u64) -> Result<Sampler, BpfError> {
            let what = "loading the on-CPU sampler (BPF on CPU-clock perf events)";
            let mut maps = Vec::new();
            for m in &MAPS {
                maps.push((m.0, map_create(m).map_err(|e| refused(what, e))?));
            }
            if let Some(w) = maps.iter().find(|m| m.0 == "WATCH") {
                for p in pids {
                    map_update(&w.1, &p.to_ne_bytes(), &[1])
                        .map_err(|e| refused(what, Error::os(what, e)))?;
                }
            }
            let prog = load_program(OBJ, "perf_event", &maps, "lt_oncpu", what, PROG_PERF_EVENT)?;
            let mut events = Vec::new();
            let mut first_err = None;
            for cpu in online_cpus() {
                match lagtrace_bpf::attach_cpu_clock(cpu, hz.max(1), &prog) {
                    Ok(e) => events.push(e),
                    // A CPU that went offline meanwhile: the others still sample.
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if events.is_empty() {
                let what = "opening a CPU-clock sampling event (perf_event_open)";
                let e = first_err.unwrap_or_else(|| std::io::Error::other("no online CPU"));
                return Err(refused(what, Error::os(what, e)));
            }
            Ok(Sampler {
                maps,
                prog,
                cpus: events.len() as u32,
                events,
                hz: hz.max(1),
                collected: None,
            })
        }

        fn map(&self, n: &str) -> Option<&OwnedFd> {
            self.maps.iter().find(|m| m.0 == n).map(|m| &m.1)
        }

        /// Stops sampling and reads the kernel's counts and stacks (once; later calls
        /// return the same): what [`Sampler::kernel_addrs`] and [`Sampler::finish`] read.
        fn collect(&mut self) -> Result<&Collected, BpfError> {
            if self.collected.is_none() {
                self.cpus = self.events.len() as u32;
                lagtrace_bpf::detach_all(std::mem::take(&mut self.events));
                self.collected = Some(self.read_maps()?);
            }
            self.collected
                .as_ref()
                .ok_or_else(|| BpfError::Kernel("its maps were not read".into()))
        }

        fn read_maps(&self) -> Result<Collected, BpfError> {
            let kernel = |e: std::io::Error| BpfError::Kernel(format!("reading its maps: {e}"));
            let (Some(cnt), Some(stk), Some(spill), Some(mis)) = (
                self.map("COUNTS"),
                self.map("STACKS"),
                self.map("SPILL"),
                self.map("MISSED"),
            ) else {
                return Err(BpfError::Kernel("a map is missing".into()));
            };
            let mut counts = Vec::new();
            lagtrace_bpf::map_for_each::<16, 8>(cnt, |k, v| {
                counts.push(RawCount {
                    tgid: u32_at(k, 0),
                    kstack: u32_at(k, 4) as i32,
                    ustack: u32_at(k, 8) as i32,
                    samples: u64_at(v, 0),
                });
            })
            .map_err(kernel)?;
            let missed = lagtrace_bpf::array_sum(mis, 2);
            let ids: std::collections::BTreeSet<i32> = counts
                .iter()
                .flat_map(|c| [c.kstack, c.ustack])
                .filter(|&id| id >= 0)
                .collect();
            let stacks: HashMap<i32, Vec<u64>> = ids
                .into_iter()
                .filter_map(|id| {
                    let addrs = if id & SPILL_BIT != 0 {
                        stack_addrs(spill, id & !SPILL_BIT, DEPTH)
                    } else {
                        stack_addrs(stk, id, DEPTH)
                    };
                    Some((id, addrs?))
                })
                .collect();
            Ok(Collected {
                counts,
                stacks,
                missed,
            })
        }

        /// The kernel addresses on the samples' stacks (stops sampling): what the caller
        /// reads `/proc/kallsyms` for, once for every tracer that needs it.
        pub fn kernel_addrs(&mut self) -> Vec<u64> {
            self.collect()
                .map(|c| {
                    c.counts
                        .iter()
                        .filter_map(|k| c.stacks.get(&k.kstack))
                        .flatten()
                        .copied()
                        .collect()
                })
                .unwrap_or_default()
        }

        /// Stops sampling and reports, with a note when the kernel's symbols could not be
        /// read (kernel frames then unnamed). `ksyms`: the kernel's symbols for
        /// [`Sampler::kernel_addrs`], when the caller read them (else read here).
        pub fn finish(
            mut self,
            ksyms: Option<&Kallsyms>,
        ) -> Result<(OnCpu, Option<String>), BpfError> {
            let kernel_addrs = self.kernel_addrs();
            let Some(Collected {
                counts,
                stacks,
                missed,
            }) = self.collected.take()
            else {
                return Err(BpfError::Kernel("its maps were not read".into()));
            };
            let own;
            let ksyms = match ksyms {
                Some(k) => k,
                None => {
                    own = Kallsyms::read(&kernel_addrs);
                    &own
                }
            };
            let note = (ksyms.is_empty() && !kernel_addrs.is_empty()).then(|| {
                "/proc/kallsyms gave no addresses (needs CAP_SYSLOG, or kernel.kptr_restrict \
                 is 2): the samples' kernel frames are unnamed"
                    .to_string()
            });
            let sym = blazesym::symbolize::Symbolizer::new();
            let (named, depth) = name_stacks(&counts, &stacks, ksyms, |tgid, addrs| {
                symbolize_user(&sym, tgid, addrs)
            });
            let mut p = profile(&named, self.hz, self.cpus, missed, depth);
            if let Some((ns, runs)) = crate::offcpu::prog_stats(&self.prog) {
                p.bpf_run_us = Some(ns / 1000);
                p.bpf_runs = Some(runs);
            }
            Ok((p, note))
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::Sampler;

/// Without the program (built without clang): never starts.
#[cfg(not(lagtrace_bpf))]
pub struct Sampler(());

#[cfg(not(lagtrace_bpf))]
impl Sampler {
    /// Always `NotBuilt`, with the build's reason.
    pub fn start(_pids: &[u32], _hz: u64) -> Result<Sampler, BpfError> {
        Err(BpfError::NotBuilt(env!("LAGTRACE_BPF_BUILD")))
    }

    /// Never reached.
    pub fn kernel_addrs(&mut self) -> Vec<u64> {
        Vec::new()
    }

    /// Never reached.
    pub fn finish(self, _ksyms: Option<&Kallsyms>) -> Result<(OnCpu, Option<String>), BpfError> {
        Ok((OnCpu::default(), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(module: &str, function: Option<&str>) -> Frame {
        Frame {
            module: module.into(),
            function: function.map(str::to_string),
        }
    }

    #[test]
    fn maps_name_the_file_an_address_lies_in() {
        let text = "\
55d0c0a00000-55d0c0a2e000 r--p 00000000 08:01 1 /usr/sbin/nginx
55d0c0a2e000-55d0c0b1f000 r-xp 0002e000 08:01 1 /usr/sbin/nginx
7f1e2c000000-7f1e2c200000 r-xp 00000000 00:00 0
7f1e2d2a0000-7f1e2d5d0000 r-xp 000a0000 08:01 2 /usr/lib/x86_64-linux-gnu/libcrypto.so.3
7f1e2e000000-7f1e2e001000 r-xp 00000000 08:01 3 /opt/my app/lib x.so (deleted)
7ffd5b9f6000-7ffd5b9f8000 r-xp 00000000 00:00 0                          [vdso]
";
        let m = Maps::parse(text);
        assert_eq!(m.module(0x55d0c0a2e000), Some("nginx"));
        assert_eq!(m.module(0x55d0c0a00010), None, "not executable");
        assert_eq!(m.module(0x7f1e2d2a1234), Some("libcrypto.so.3"));
        assert_eq!(m.module(0x7f1e2d5d0000), None, "the end is outside");
        assert_eq!(m.module(0x7f1e2c000100), Some("[jit]"));
        assert_eq!(m.module(0x7f1e2e000010), Some("lib x.so"));
        assert_eq!(m.module(0x7ffd5b9f6001), Some("[vdso]"));
        assert_eq!(m.module(1), None);
    }

    #[test]
    fn cpu_lists_are_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,6\n"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("0\n"), vec![0]);
        assert!(parse_cpu_list("").is_empty());
    }

    #[test]
    fn self_time_is_the_innermost_frame_and_folded_stacks_are_root_first() {
        let stacks = vec![
            Stack {
                frames: vec![
                    f("libcrypto.so.3", None),
                    f("nginx", Some("ngx_ssl_handshake")),
                ],
                samples: 60,
            },
            Stack {
                frames: vec![
                    Frame::kernel(Some("copy_user_enhanced_fast_string")),
                    Frame::kernel(Some("tcp_sendmsg")),
                    f("libc.so.6", Some("writev")),
                ],
                samples: 30,
            },
            Stack {
                frames: vec![f("nginx", Some("ngx_http_parse_request_line"))],
                samples: 10,
            },
        ];
        let p = profile(&stacks, 199, 2, 3, 2);
        assert_eq!(p.samples, 100);
        assert_eq!(p.missed, 3);
        assert_eq!(p.modules[0].module, "libcrypto.so.3");
        assert!((p.modules[0].share - 0.6).abs() < 1e-9);
        assert_eq!(p.modules[1].module, "[kernel]");
        assert_eq!(p.functions[0].label(), "libcrypto.so.3 (no symbol)");
        assert_eq!(
            p.functions[1].function.as_deref(),
            Some("copy_user_enhanced_fast_string")
        );
        assert_eq!(
            p.folded[0].stack, "nginx`ngx_ssl_handshake;libcrypto.so.3",
            "root first"
        );
        assert_eq!(
            p.folded[1].stack,
            "libc.so.6`writev;tcp_sendmsg_[k];copy_user_enhanced_fast_string_[k]"
        );
        assert_eq!(p.folded_left_out, 0);
        assert_eq!(p.hint, None);
    }

    #[test]
    fn folded_stacks_are_bounded_and_what_is_left_out_is_counted() {
        let stacks: Vec<Stack> = (0..OnCpu::FOLDED_MAX as u64 + 10)
            .map(|i| Stack {
                frames: vec![f("app", Some(&format!("f{i}")))],
                samples: 1 + i,
            })
            .collect();
        let p = profile(&stacks, 99, 1, 0, 1);
        assert_eq!(p.folded.len(), OnCpu::FOLDED_MAX);
        // The ten smallest (1..=10 samples) are left out.
        assert_eq!(p.folded_left_out, (1..=10).sum::<u64>());
        assert_eq!(p.functions.len(), FUNCTIONS);
        assert_eq!(
            p.samples,
            p.folded.iter().map(|f| f.samples).sum::<u64>() + 55
        );
    }

    #[test]
    fn an_interpreter_or_a_jit_gets_the_flag_that_names_its_frames() {
        let one = |module: &str, function: Option<&str>| {
            vec![Stack {
                frames: vec![f(module, function)],
                samples: 10,
            }]
        };
        let py = profile(
            &one("python3.11", Some("_PyEval_EvalFrameDefault")),
            99,
            1,
            0,
            1,
        );
        assert!(py.hint.as_deref().unwrap().contains("-X perf"));
        let mut js = one("[jit]", None);
        js.push(Stack {
            frames: vec![f("node", Some("uv_run"))],
            samples: 1,
        });
        let js = profile(&js, 99, 1, 0, 1);
        assert!(
            js.hint.as_deref().unwrap().contains("--perf-basic-prof"),
            "{js:?}"
        );
        let c = profile(&one("libz.so.1", None), 99, 1, 0, 1);
        assert_eq!(c.hint, None);
        // JIT code a perf map names needs no flag.
        let named = profile(&one("[jit]", Some("JS:*busyRender")), 99, 1, 0, 1);
        assert_eq!(named.hint, None);
    }

    #[test]
    fn user_frames_are_named_per_process_and_return_addresses_one_byte_back() {
        let counts = [
            RawCount {
                tgid: 7,
                kstack: -14,
                ustack: 1,
                samples: 5,
            },
            RawCount {
                tgid: 7,
                kstack: 2,
                ustack: 1,
                samples: 2,
            },
        ];
        let stacks: HashMap<i32, Vec<u64>> =
            [(1, vec![0x1000, 0x2005]), (2, vec![0xffff_ffff_8100_0010])]
                .into_iter()
                .collect();
        let ksyms = Kallsyms::parse("ffffffff81000000 T do_syscall_64\n");
        let mut asked = Vec::new();
        let (v, depth) = name_stacks(&counts, &stacks, &ksyms, |tgid, addrs| {
            asked.push((tgid, addrs.to_vec()));
            addrs
                .iter()
                .map(|a| f("app", Some(&format!("at{a:x}"))))
                .collect()
        });
        assert_eq!(asked, vec![(7, vec![0x1000, 0x2004])]);
        assert_eq!(depth, 2);
        assert_eq!(v[0].samples, 5);
        assert_eq!(
            v[0].frames,
            vec![f("app", Some("at1000")), f("app", Some("at2004"))]
        );
        assert_eq!(v[1].frames[0], Frame::kernel(Some("do_syscall_64")));
        assert_eq!(v[1].frames.len(), 3);
    }

    #[test]
    fn symbols_name_a_function_of_this_process_and_its_library() {
        // This test binary's own function, through blazesym and /proc/self/maps.
        let addr = super::profile as *const () as usize as u64;
        let sym = blazesym::symbolize::Symbolizer::new();
        let v = symbolize_user(&sym, std::process::id(), &[addr]);
        assert!(
            v[0].function
                .as_deref()
                .is_some_and(|f| f.contains("profile")),
            "{v:?}"
        );
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(v[0].module, name);
    }
}
