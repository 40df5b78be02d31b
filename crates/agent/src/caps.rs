//! Least privilege: after start the agent keeps only the capabilities its layers need.
//!
//! - `CAP_NET_RAW`: the capture (packet socket).
//! - `CAP_SYS_PTRACE`: the server's socket options (`pidfd_getfd`) and `/proc/PID/fd`.
//! - `CAP_BPF`, `CAP_PERFMON`: the host layer's drops by reason (BPF, perf events).
//! - `CAP_SYS_ADMIN`: entering a namespace, and perf/BPF on kernels without the two above.
//!
//! Every other capability leaves the effective, permitted, inheritable and bounding sets,
//! and `no_new_privs` is set: no exec regains one.
//! Capability sets are per thread: [`drop_to_needed`] runs before the agent starts its
//! runtime's threads, which inherit the reduced sets.

use rustix::thread::{CapabilitySet, CapabilitySets};

use lagtrace_model::Capability;

/// The capabilities the layers use, with the model's names.
pub const NEEDED: [Capability; 5] = [
    Capability::NetRaw,
    Capability::SysPtrace,
    Capability::Bpf,
    Capability::Perfmon,
    Capability::SysAdmin,
];

fn set_of(c: Capability) -> CapabilitySet {
    match c {
        Capability::NetRaw => CapabilitySet::NET_RAW,
        Capability::NetAdmin => CapabilitySet::NET_ADMIN,
        Capability::SysAdmin => CapabilitySet::SYS_ADMIN,
        Capability::SysPtrace => CapabilitySet::SYS_PTRACE,
        Capability::Bpf => CapabilitySet::BPF,
        Capability::Perfmon => CapabilitySet::PERFMON,
    }
}

/// What [`drop_to_needed`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropped {
    /// Needed capabilities the agent holds (kept).
    pub kept: Vec<Capability>,
    /// Needed capabilities it does not hold: the layers using them will say so.
    pub missing: Vec<Capability>,
    /// Capabilities it held and gave up.
    pub given_up: u32,
}

/// Keeps [`NEEDED`] (those held) and drops every other capability of this thread, from
/// its bounding set too, so no later exec can regain them.
pub fn drop_to_needed() -> std::io::Result<Dropped> {
    let now = rustix::thread::capabilities(None)?;
    let needed = NEEDED
        .iter()
        .fold(CapabilitySet::empty(), |s, c| s | set_of(*c));
    let keep = now.permitted & needed;
    let (kept, missing): (Vec<Capability>, Vec<Capability>) = NEEDED
        .iter()
        .partition(|c| now.permitted.contains(set_of(**c)));
    // The bounding set (needs CAP_SETPCAP while we still hold it): every capability not kept.
    if now.effective.contains(CapabilitySet::SETPCAP) {
        for bit in 0..=63u32 {
            let Some(one) = CapabilitySet::from_bits(1u64 << bit) else {
                continue;
            };
            if !keep.contains(one) && !one.is_empty() {
                // Capabilities this kernel does not know fail with EINVAL: nothing to drop.
                let _ = rustix::thread::remove_capability_from_bounding_set(one);
            }
        }
    }
    let _ = rustix::thread::clear_ambient_capability_set();
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    // No exec can give any privilege back: setuid bits and file capabilities are ignored
    // from here on (what the layers run — nft, for the rule walk — needs neither).
    rustix::thread::set_no_new_privs(true)?;
    Ok(Dropped {
        kept,
        missing,
        given_up: (now.permitted & !keep).bits().count_ones(),
    })
}
