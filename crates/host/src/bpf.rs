//! Drops by (device, reason) in one network namespace: a small BPF program on the
//! `skb:kfree_skb` tracepoint (bpf/drops.bpf.c, built by build.rs with clang) reads the
//! namespace and device from the skb (its device, else its route's device, else its
//! socket's namespace) and counts in a kernel map only the watched namespace's drops.
//!
//! Loaded by hand with bpf(2): the object's one program and three maps, the map references
//! set to their descriptors, attached through a perf event on the tracepoint. The program
//! has no CO-RE relocations: the struct offsets it reads come from the running kernel's
//! BTF ([`lagtrace_bpf::btf`], one pass over it) through its CONF map. A full BTF loader (aya)
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
    use lagtrace_bpf::btf::{Btf, BtfError, VMLINUX, Vmlinux};
    use lagtrace_bpf::{Error, MAP_ARRAY, MAP_HASH, MapSpec, Object, PROG_TRACEPOINT, ProgSpec};
    use lagtrace_model::Capability;
    use std::os::fd::{AsRawFd, OwnedFd};

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/drops.bpf.o"));

    const PROG_SECTION: &str = "tracepoint/skb/kfree_skb";

    /// The program's maps (as drops.bpf.c declares them).
    const MAPS: [MapSpec; 3] = [
        ("CONF", MAP_ARRAY, 4, 48, 1),
        ("DROPS", MAP_HASH, 16, 8, 4096),
        ("MISSED", MAP_ARRAY, 4, 8, 1),
    ];

    /// The list above says what the object declares (a struct grown in the C source and not
    /// here is refused by the verifier with a message about a register).
    #[cfg(test)]
    #[test]
    fn maps_agree_with_the_object() {
        lagtrace_bpf::check_maps(OBJ, &MAPS).unwrap();
    }

    /// Byte offsets of the kernel fields the program reads (a path through nested structs
    /// is summed: `net_device.nd_net.net`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct KernelOffsets {
        skb_dev: u32,
        skb_refdst: u32,
        skb_sk: u32,
        dst_dev: u32,
        dev_net: u32,
        net_inum: u32,
        dev_ifindex: u32,
        sk_net: u32,
    }

    /// The program's offsets from the BTF blob `b`.
    pub fn kernel_offsets(b: &[u8]) -> Result<KernelOffsets, BtfError> {
        let btf = Btf::parse(b)?;
        Ok(KernelOffsets {
            skb_dev: btf.offset("sk_buff", &["dev"])?,
            skb_refdst: btf.offset("sk_buff", &["_skb_refdst"])?,
            skb_sk: btf.offset("sk_buff", &["sk"])?,
            dst_dev: btf.offset("dst_entry", &["dev"])?,
            dev_net: btf.offset("net_device", &["nd_net", "net"])?,
            net_inum: btf.offset("net", &["ns", "inum"])?,
            dev_ifindex: btf.offset("net_device", &["ifindex"])?,
            sk_net: btf.offset("sock", &["__sk_common", "skc_net", "net"])?,
        })
    }

    /// The counter while it is attached (detached when dropped: closing the perf event
    /// detaches the program).
    pub struct NsDrops {
        drops: OwnedFd,
        missed: OwnedFd,
        _prog: OwnedFd,
        _event: OwnedFd,
    }

    /// `what` failed with `e`: a missing privilege names CAP_BPF and CAP_PERFMON.
    pub(crate) fn refused(what: &str, e: Error) -> BpfError {
        match e {
            Error::Denied(..) => {
                BpfError::Privilege(Privilege::new(Capability::Bpf, what, " and CAP_PERFMON"))
            }
            e => BpfError::Kernel(e.to_string()),
        }
    }

    /// Loads the tracepoint program in `section` of the object `obj` as `name`, its map
    /// references set to `maps` (name, descriptor); `what` names the step in errors.
    pub(crate) fn load_tracepoint(
        obj: &[u8],
        section: &str,
        maps: &[(&'static str, OwnedFd)],
        name: &str,
        what: &str,
    ) -> Result<OwnedFd, BpfError> {
        load_program(obj, section, maps, name, what, PROG_TRACEPOINT)
    }

    /// [`load_tracepoint`] for a program of type `prog_type` (a raw tracepoint's).
    pub(crate) fn load_program(
        obj: &[u8],
        section: &str,
        maps: &[(&'static str, OwnedFd)],
        name: &str,
        what: &str,
        prog_type: u32,
    ) -> Result<OwnedFd, BpfError> {
        let fds: Vec<(&str, i32)> = maps.iter().map(|(n, f)| (*n, f.as_raw_fd())).collect();
        let obj = Object::parse(obj).map_err(|e| refused(what, e))?;
        let insns = obj.program(section, &fds).map_err(|e| refused(what, e))?;
        let license = obj.license().map_err(|e| refused(what, e))?;
        let spec = ProgSpec {
            name,
            prog_type,
            attach_type: 0,
            attach_btf_id: 0,
        };
        lagtrace_bpf::prog_load(&insns, license, &spec).map_err(|e| refused(what, e))
    }

    impl NsDrops {
        /// Loads and attaches the counter for the namespace with inode `netns`; `tp` is the
        /// tracepoint's id and record layout (its format file).
        pub fn start(netns: u32, tp: &Tracepoint) -> Result<NsDrops, BpfError> {
            let what = "loading the per-namespace drop counter (BPF)";
            let btf = Vmlinux::open().map_err(|e| BpfError::Kernel(format!("{VMLINUX}: {e}")))?;
            let k = kernel_offsets(btf.bytes()).map_err(|e| BpfError::Kernel(e.to_string()))?;
            drop(btf);
            let mut maps = Vec::new();
            for m in &MAPS {
                maps.push((
                    m.0,
                    lagtrace_bpf::map_create(m).map_err(|e| refused(what, e))?,
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
            lagtrace_bpf::map_update(&maps[0].1, &0u32.to_ne_bytes(), &conf)
                .map_err(|e| refused(what, Error::os(what, e)))?;
            let prog = load_tracepoint(OBJ, PROG_SECTION, &maps, "lt_drops", what)?;
            let event = lagtrace_bpf::attach_tracepoint(tp.id, &prog).map_err(|e| {
                let what = "attaching it to skb:kfree_skb";
                refused(what, Error::os(what, e))
            })?;
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
            lagtrace_bpf::map_for_each::<16, 8>(&self.drops, |k, v| {
                let key = (lagtrace_bpf::u32_at(k, 4), lagtrace_bpf::u32_at(k, 8));
                *out.counts.entry(key).or_default() += lagtrace_bpf::u64_at(v, 0);
            })
            .map_err(kernel)?;
            let mut v = [0u8; 8];
            lagtrace_bpf::map_lookup(&self.missed, &0u32.to_ne_bytes(), &mut v).map_err(kernel)?;
            out.missed = u64::from_ne_bytes(v);
            Ok(out)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn reads_the_running_kernels_offsets() {
            let Ok(b) = Vmlinux::open() else {
                return; // no BTF on this machine: nothing to check
            };
            let o = kernel_offsets(b.bytes()).unwrap();
            // Fields that are not at the start of their struct on any kernel.
            assert!(o.skb_sk > 0 && o.dev_ifindex > 0 && o.net_inum > 0, "{o:?}");
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::NsDrops;
#[cfg(lagtrace_bpf)]
pub(crate) use imp::{load_program, load_tracepoint, refused};

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
