//! Drops by (device, reason) in one network namespace: a small BPF program on the
//! `skb:kfree_skb` tracepoint (bpf/drops.bpf.c, built by build.rs with clang, CO-RE)
//! reads the namespace and device from the skb (its device, else its route's device, else
//! its socket's namespace) and counts in a kernel map only the watched namespace's drops.
//! Loaded with aya (a pure-Rust loader: no libbpf, no libelf).

use std::collections::BTreeMap;

use lagtrace_model::Privilege;

/// Why the per-namespace counter cannot run; the drop layer then counts machine-wide.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The crate was built without the program (no clang, bpftool or BTF at build time).
    #[error("the per-namespace drop counter was {0}")]
    NotBuilt(&'static str),
    /// Loading or attaching needs CAP_BPF and CAP_PERFMON.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// The kernel refused it otherwise (no BTF, verifier, no tracepoint).
    #[error("the per-namespace drop counter: {0}")]
    Kernel(String),
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
    use aya::maps::{Array, HashMap};
    use aya::programs::TracePoint;
    use aya::{Ebpf, EbpfLoader, Pod};
    use lagtrace_model::Capability;

    static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/drops.bpf.o"));

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct DropKey {
        netns: u32,
        ifindex: u32,
        reason: u32,
        pad: u32,
    }
    // SAFETY: plain C struct of u32s, no padding, any bit pattern valid.
    unsafe impl Pod for DropKey {}

    /// The counter while it is attached (detached on drop).
    pub struct NsDrops {
        ebpf: Ebpf,
    }

    fn refused(what: &str, e: &(dyn std::error::Error + 'static)) -> BpfError {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if let Some(libc::EPERM | libc::EACCES) = io.raw_os_error() {
                    let p = Privilege::new(Capability::Bpf, what, " and CAP_PERFMON");
                    return BpfError::Privilege(p);
                }
            }
            cur = err.source();
        }
        BpfError::Kernel(format!("{what}: {e}"))
    }

    impl NsDrops {
        /// Loads and attaches the counter for the namespace with inode `netns`.
        pub fn start(netns: u32) -> Result<NsDrops, BpfError> {
            let what = "loading the per-namespace drop counter (BPF)";
            let mut ebpf = EbpfLoader::new()
                .set_global("watch_netns", &netns, true)
                .load(OBJ)
                .map_err(|e| refused(what, &e))?;
            let tp: &mut TracePoint = ebpf
                .program_mut("kfree_skb")
                .ok_or_else(|| BpfError::Kernel("no kfree_skb program in the object".into()))?
                .try_into()
                .map_err(|e| refused(what, &e))?;
            tp.load().map_err(|e| refused(what, &e))?;
            tp.attach("skb", "kfree_skb")
                .map_err(|e| refused("attaching it to skb:kfree_skb", &e))?;
            Ok(NsDrops { ebpf })
        }

        /// The counts so far.
        pub fn read(&self) -> Result<NsCounts, BpfError> {
            let kernel = |e: aya::maps::MapError| BpfError::Kernel(format!("reading its map: {e}"));
            let map = self
                .ebpf
                .map("DROPS")
                .ok_or_else(|| BpfError::Kernel("no DROPS map".into()))?;
            let drops: HashMap<_, DropKey, u64> = HashMap::try_from(map).map_err(kernel)?;
            let mut out = NsCounts::default();
            for kv in drops.iter() {
                let (k, v) = kv.map_err(kernel)?;
                *out.counts.entry((k.ifindex, k.reason)).or_default() += v;
            }
            if let Some(m) = self.ebpf.map("MISSED") {
                let missed: Array<_, u64> = Array::try_from(m).map_err(kernel)?;
                out.missed = missed.get(&0, 0).unwrap_or(0);
            }
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
    pub fn start(_netns: u32) -> Result<NsDrops, BpfError> {
        Err(BpfError::NotBuilt(env!("LAGTRACE_BPF_BUILD")))
    }

    /// Never reached.
    pub fn read(&self) -> Result<NsCounts, BpfError> {
        Ok(NsCounts::default())
    }
}

/// How the build went: `built`, or `not built: <why>`.
pub const BUILD: &str = env!("LAGTRACE_BPF_BUILD");
