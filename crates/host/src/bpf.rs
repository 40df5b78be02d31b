//! Drops by (device, reason) in one network namespace: a small BPF program on the
//! `skb:kfree_skb` tracepoint (bpf/drops.bpf.c, built by build.rs with clang) reads the
//! namespace and device from the skb (its device, else its route's device, else its
//! socket's namespace) and counts in a kernel map only the watched namespace's drops.
//!
//! Loaded by hand with bpf(2): the object's one program and three maps, the map references
//! set to their descriptors, attached through a perf event on the tracepoint. The program
//! has no CO-RE relocations: the struct offsets it reads come from the running kernel's
//! BTF ([`crate::btf`], one pass over it) through its CONF map. A full BTF loader (aya)
//! cost ~33 ms of CPU per start, over 2 % of one core for a 2 s window; this costs a few.

use std::collections::BTreeMap;

use lagtrace_model::Privilege;

/// Why the per-namespace counter cannot run; the drop layer then counts machine-wide.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The crate was built without the program (no clang or headers at build time).
    #[error("the per-namespace drop counter was {0}")]
    NotBuilt(&'static str),
    /// Loading or attaching needs CAP_BPF and CAP_PERFMON.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// The kernel refused it otherwise (no BTF, verifier, no tracepoint).
    #[error("the per-namespace drop counter: {0}")]
    Kernel(String),
}

/// The tracepoint's id and the byte offsets of `skbaddr` and `reason` in its record (from
/// its format file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracepoint {
    /// perf's `config` for it.
    pub id: u64,
    /// Offset of `skbaddr`.
    pub skbaddr: u32,
    /// Offset of `reason` (4 bytes).
    pub reason: u32,
}

/// Drops of one namespace: (ifindex, reason) → count, and what the map had no room for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsCounts {
    /// (ifindex, reason number) → drops; ifindex 0: no device known.
    pub counts: BTreeMap<(u32, u32), u64>,
    /// Drops not counted (map full): the counts are then lower bounds.
    pub missed: u64,
}

#[cfg(lagtrace_bpf)]
mod imp {
    use super::*;
    use crate::btf::KernelOffsets;
    use lagtrace_model::Capability;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/drops.bpf.o"));

    const PROG_SECTION: &str = "tracepoint/skb/kfree_skb";
    const BPF_MAP_CREATE: i64 = 0;
    const BPF_MAP_LOOKUP_ELEM: i64 = 1;
    const BPF_MAP_UPDATE_ELEM: i64 = 2;
    const BPF_MAP_GET_NEXT_KEY: i64 = 4;
    const BPF_PROG_LOAD: i64 = 5;
    const MAP_HASH: u32 = 1;
    const MAP_ARRAY: u32 = 2;
    const PROG_TRACEPOINT: u32 = 5;
    const PSEUDO_MAP_FD: u8 = 1;
    const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
    const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

    /// The program's maps (as drops.bpf.c declares them): name, type, key and value size,
    /// entries.
    const MAPS: [(&str, u32, u32, u32, u32); 3] = [
        ("CONF", MAP_ARRAY, 4, 48, 1),
        ("DROPS", MAP_HASH, 16, 8, 4096),
        ("MISSED", MAP_ARRAY, 4, 8, 1),
    ];

    /// The counter while it is attached (detached when dropped: closing the perf event
    /// detaches the program).
    pub struct NsDrops {
        drops: OwnedFd,
        missed: OwnedFd,
        _prog: OwnedFd,
        _event: OwnedFd,
    }

    fn sys_bpf(cmd: i64, attr: &mut [u8]) -> std::io::Result<i32> {
        // SAFETY: attr is a zero-padded `union bpf_attr` prefix of the length passed.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
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

    fn refused(what: &str, e: std::io::Error) -> BpfError {
        if let Some(libc::EPERM | libc::EACCES) = e.raw_os_error() {
            return BpfError::Privilege(Privilege::new(Capability::Bpf, what, " and CAP_PERFMON"));
        }
        BpfError::Kernel(format!("{what}: {e}"))
    }

    fn map_create(ty: u32, key: u32, value: u32, entries: u32) -> std::io::Result<OwnedFd> {
        let mut a = [0u8; 72];
        for (i, v) in [ty, key, value, entries].iter().enumerate() {
            put(&mut a, 4 * i, &v.to_ne_bytes());
        }
        sys_bpf(BPF_MAP_CREATE, &mut a).map(fd)
    }

    /// lookup / update / next-key: map fd, key, value (or next key), flags.
    fn map_op(cmd: i64, map: &OwnedFd, key: *const u8, val: *mut u8) -> std::io::Result<()> {
        let mut a = [0u8; 32];
        put(&mut a, 0, &map.as_raw_fd().to_ne_bytes());
        put(&mut a, 8, &(key as u64).to_ne_bytes());
        put(&mut a, 16, &(val as u64).to_ne_bytes());
        sys_bpf(cmd, &mut a).map(|_| ())
    }

    fn u16_at(b: &[u8], o: usize) -> Option<u16> {
        Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
    }
    fn u32_at(b: &[u8], o: usize) -> Option<u32> {
        Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
    }
    fn u64_at(b: &[u8], o: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
    }

    /// The program's instructions with each map reference set to its descriptor, and its
    /// license, from the ELF object (64-bit little-endian, as clang writes for `bpf`).
    fn program(obj: &[u8], fds: &[(&str, i32)]) -> Option<(Vec<u8>, Vec<u8>)> {
        let (shoff, shnum) = (u64_at(obj, 0x28)? as usize, u16_at(obj, 0x3c)? as usize);
        let shstr = u16_at(obj, 0x3e)? as usize;
        let sh = |i: usize| -> Option<(u32, u32, usize, usize, u32, u32)> {
            let h = shoff + 64 * i;
            Some((
                u32_at(obj, h)?,
                u32_at(obj, h + 4)?,
                u64_at(obj, h + 24)? as usize,
                u64_at(obj, h + 32)? as usize,
                u32_at(obj, h + 40)?,
                u32_at(obj, h + 44)?,
            ))
        };
        let data = |i: usize| sh(i).and_then(|(_, _, off, size, _, _)| obj.get(off..off + size));
        let cstr = |b: &[u8], off: usize| -> Option<Vec<u8>> {
            let s = b.get(off..)?;
            Some(s[..s.iter().position(|&c| c == 0)?].to_vec())
        };
        let names = data(shstr)?;
        let name_of = |i: usize| sh(i).and_then(|s| cstr(names, s.0 as usize));
        let find = |n: &str| (0..shnum).find(|&i| name_of(i).as_deref() == Some(n.as_bytes()));
        let prog = find(PROG_SECTION)?;
        let mut insns = data(prog)?.to_vec();
        let license = data(find("license")?)?.to_vec();
        // Its relocations (SHT_REL whose info is the program), against symbols in .symtab.
        let rel = (0..shnum).find(|&i| sh(i).is_some_and(|s| s.1 == 9 && s.5 as usize == prog))?;
        let (_, _, _, _, symtab, _) = sh(rel)?;
        let syms = data(symtab as usize)?;
        let strtab = data(sh(symtab as usize)?.4 as usize)?;
        for r in data(rel)?.chunks_exact(16) {
            let (at, sym) = (u64_at(r, 0)? as usize, (u64_at(r, 8)? >> 32) as usize);
            let name = cstr(strtab, u32_at(syms, 24 * sym)? as usize)?;
            let (_, map_fd) = fds.iter().find(|(n, _)| n.as_bytes() == name)?;
            let regs = insns.get_mut(at + 1)?;
            *regs = (*regs & 0x0f) | (PSEUDO_MAP_FD << 4);
            insns
                .get_mut(at + 4..at + 8)?
                .copy_from_slice(&map_fd.to_ne_bytes());
        }
        Some((insns, license))
    }

    fn load(insns: &[u8], license: &[u8]) -> Result<OwnedFd, BpfError> {
        let mut lic = license.to_vec();
        lic.push(0);
        let mut log = vec![0u8; 16 * 1024];
        let mut a = [0u8; 72];
        put(&mut a, 0, &PROG_TRACEPOINT.to_ne_bytes());
        put(&mut a, 4, &((insns.len() / 8) as u32).to_ne_bytes());
        put(&mut a, 8, &(insns.as_ptr() as u64).to_ne_bytes());
        put(&mut a, 16, &(lic.as_ptr() as u64).to_ne_bytes());
        put(&mut a, 48, b"lt_drops");
        match sys_bpf(BPF_PROG_LOAD, &mut a) {
            Ok(p) => Ok(fd(p)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                Err(refused("loading the per-namespace drop counter (BPF)", e))
            }
            Err(_) => {
                // Again with the verifier's log, for the reason.
                put(&mut a, 24, &1u32.to_ne_bytes());
                put(&mut a, 28, &(log.len() as u32).to_ne_bytes());
                put(&mut a, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
                let e = sys_bpf(BPF_PROG_LOAD, &mut a).err();
                let text =
                    String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)]);
                let last = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                Err(BpfError::Kernel(format!(
                    "the verifier refused the per-namespace drop counter: {} ({last})",
                    e.map_or("?".into(), |e| e.to_string())
                )))
            }
        }
    }

    /// Opens the tracepoint `tp_id` (one event: a tracepoint program runs on every CPU)
    /// and attaches `prog`.
    fn attach(tp_id: u64, prog: &OwnedFd) -> std::io::Result<OwnedFd> {
        let mut attr = [0u8; 64];
        attr[0..4].copy_from_slice(&2u32.to_ne_bytes()); // PERF_TYPE_TRACEPOINT
        attr[4..8].copy_from_slice(&64u32.to_ne_bytes());
        attr[8..16].copy_from_slice(&tp_id.to_ne_bytes());
        attr[16..24].copy_from_slice(&1u64.to_ne_bytes());
        // SAFETY: attr is a valid perf_event_attr of the size it declares.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1,
                0,
                -1,
                8 as libc::c_ulong,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
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
            Err(std::io::Error::last_os_error())
        }
    }

    impl NsDrops {
        /// Loads and attaches the counter for the namespace with inode `netns`; `tp` is the
        /// tracepoint's id and record layout (its format file).
        pub fn start(netns: u32, tp: &Tracepoint) -> Result<NsDrops, BpfError> {
            let what = "loading the per-namespace drop counter (BPF)";
            let btf = crate::btf::Vmlinux::open()
                .map_err(|e| BpfError::Kernel(format!("{}: {e}", crate::btf::VMLINUX)))?;
            let k: KernelOffsets = crate::btf::kernel_offsets(btf.bytes())
                .map_err(|e| BpfError::Kernel(e.to_string()))?;
            drop(btf);
            let mut maps = Vec::new();
            for (name, ty, key, value, entries) in MAPS {
                maps.push((
                    name,
                    map_create(ty, key, value, entries).map_err(|e| refused(what, e))?,
                ));
            }
            let conf: Vec<u8> = [
                netns,
                tp.skbaddr,
                tp.reason,
                k.skb_dev,
                k.skb_refdst,
                k.skb_sk,
                k.dst_dev,
                k.dev_net,
                k.net_inum,
                k.dev_ifindex,
                k.sk_net,
                0,
            ]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
            let zero = 0u32.to_ne_bytes();
            map_op(
                BPF_MAP_UPDATE_ELEM,
                &maps[0].1,
                zero.as_ptr(),
                conf.as_ptr().cast_mut(),
            )
            .map_err(|e| refused(what, e))?;
            let fds: Vec<(&str, i32)> = maps.iter().map(|(n, f)| (*n, f.as_raw_fd())).collect();
            let (insns, license) = program(OBJ, &fds)
                .ok_or_else(|| BpfError::Kernel("the BPF object is malformed".into()))?;
            let prog = load(&insns, &license)?;
            let event =
                attach(tp.id, &prog).map_err(|e| refused("attaching it to skb:kfree_skb", e))?;
            let mut maps = maps.into_iter().map(|m| m.1).skip(1);
            let (Some(drops), Some(missed)) = (maps.next(), maps.next()) else {
                return Err(BpfError::Kernel("no DROPS map".into()));
            };
            Ok(NsDrops {
                drops,
                missed,
                _prog: prog,
                _event: event,
            })
        }

        /// The counts so far.
        pub fn read(&self) -> Result<NsCounts, BpfError> {
            let kernel = |e: std::io::Error| BpfError::Kernel(format!("reading its map: {e}"));
            let mut out = NsCounts::default();
            let mut key = [0u8; 16];
            let mut next = [0u8; 16];
            let mut first = true;
            loop {
                let from = if first {
                    std::ptr::null()
                } else {
                    key.as_ptr()
                };
                match map_op(BPF_MAP_GET_NEXT_KEY, &self.drops, from, next.as_mut_ptr()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                    Err(e) => return Err(kernel(e)),
                }
                first = false;
                key = next;
                let mut v = [0u8; 8];
                if map_op(
                    BPF_MAP_LOOKUP_ELEM,
                    &self.drops,
                    key.as_ptr(),
                    v.as_mut_ptr(),
                )
                .is_ok()
                {
                    let k =
                        |o: usize| u32::from_ne_bytes([key[o], key[o + 1], key[o + 2], key[o + 3]]);
                    *out.counts.entry((k(4), k(8))).or_default() += u64::from_ne_bytes(v);
                }
            }
            let zero = 0u32.to_ne_bytes();
            let mut v = [0u8; 8];
            map_op(
                BPF_MAP_LOOKUP_ELEM,
                &self.missed,
                zero.as_ptr(),
                v.as_mut_ptr(),
            )
            .map_err(kernel)?;
            out.missed = u64::from_ne_bytes(v);
            Ok(out)
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::NsDrops;

/// Without the program (built without clang): never starts.
#[cfg(not(lagtrace_bpf))]
pub struct NsDrops(());

#[cfg(not(lagtrace_bpf))]
impl NsDrops {
    /// Always `NotBuilt`, with the build's reason.
    pub fn start(_netns: u32, _tp: &Tracepoint) -> Result<NsDrops, BpfError> {
        Err(BpfError::NotBuilt(env!("LAGTRACE_BPF_BUILD")))
    }

    /// Never reached.
    pub fn read(&self) -> Result<NsCounts, BpfError> {
        Ok(NsCounts::default())
    }
}

/// How the build went: `built`, or `not built: <why>`.
pub const BUILD: &str = env!("LAGTRACE_BPF_BUILD");
