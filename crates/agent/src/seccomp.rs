//! A seccomp filter for the agent: after its capabilities are dropped, the system calls that
//! would let a compromised agent change the host or reach into another process are refused
//! with `EPERM`, on every thread and in every program it runs (nft). What the layers use —
//! capture, BPF, perf events, `pidfd_getfd`, sock_diag, entering a namespace — stays allowed.
//!
//! A deny list, not an allow list: the layers' syscalls (the runtime's, libpcap's, the BPF
//! loader's, the programs the agent runs) are many and change with the libraries; a missing
//! entry in an allow list would kill the agent in the middle of a session. What is refused:
//! - `ptrace`, `process_vm_readv`, `process_vm_writev`: reading or writing another process's
//!   memory (`pidfd_getfd` is the one way the agent looks into the server, and it stays);
//! - `mount`, `umount2`, `pivot_root`, `chroot` and the new mount API (`fsopen`, `fsconfig`,
//!   `fsmount`, `fspick`, `move_mount`, `open_tree`, `mount_setattr`): CAP_SYS_ADMIN is kept
//!   for entering a namespace, not for mounting;
//! - `init_module`, `finit_module`, `delete_module`, `kexec_load`, `kexec_file_load`, `reboot`,
//!   `swapon`, `swapoff`, `acct`, `iopl`, `ioperm`: the kernel itself;
//! - `settimeofday`, `clock_settime`, `clock_adjtime`, `adjtimex`, `sethostname`,
//!   `setdomainname`: the host's clock and names;
//! - `open_by_handle_at`, `name_to_handle_at`: opening files by handle around the path checks;
//! - `keyctl`, `add_key`, `request_key`, `userfaultfd`: the kernel keyring and a common
//!   exploit's tool, neither of any use to the agent.
//!
//! A call through i386's ABI (`int 0x80`) kills the process (seccompiler's architecture
//! check: the numbers above would not mean the same calls there). The x32 ABI is not
//! covered (its calls carry the x86_64 architecture with bit 30 set); kernels built without
//! it, or with it off at boot as Debian's default, have none.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The refused system calls, by name (for the README and the test) and number.
pub const DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
];

/// The filter: [`DENIED`] → `EPERM`, everything else allowed (seccompiler's architecture
/// check first).
pub fn program() -> Result<BpfProgram, seccompiler::BackendError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let arch = if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        TargetArch::x86_64
    };
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?
    .try_into()
}

/// Installs the filter on every thread of the process (`no_new_privs` must be set, as
/// [`crate::caps::drop_to_needed`] does).
pub fn install_all_threads() -> Result<(), String> {
    let p = program().map_err(|e| e.to_string())?;
    seccompiler::apply_filter_all_threads(&p).map_err(|e| e.to_string())
}

/// Installs the filter on the calling thread only (its `no_new_privs` set first): what a
/// test needs to try the refused calls without refusing them to the rest of the process.
pub fn install_this_thread() -> Result<(), String> {
    rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
    let p = program().map_err(|e| e.to_string())?;
    seccompiler::apply_filter(&p).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own (the filter is per thread without TSYNC, so the test harness
    /// keeps every call): each refused call gets EPERM from the real kernel — ptrace and
    /// process_vm_readv/writev on another process of this user (root in CI: a child `sleep`),
    /// a mount — and an allowed one still works. Unfiltered, the ptrace would attach and the
    /// mount fail with ENOENT.
    #[test]
    fn the_refused_calls_get_eperm_and_the_rest_still_work() {
        struct Child(std::process::Child);
        impl Drop for Child {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let other = Child(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("start another process"),
        );
        let pid = other.0.id() as libc::pid_t;
        std::thread::spawn(move || {
            install_this_thread().expect("install the filter");
            let errno = || std::io::Error::last_os_error().raw_os_error();
            // SAFETY: each call is made with arguments the kernel checks; none touches this
            // process's memory but the empty iovecs and the path strings.
            unsafe {
                assert_eq!(libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0), -1);
                assert_eq!(errno(), Some(libc::EPERM), "ptrace");
                let mut b = [0u8; 8];
                let local = libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                };
                let remote = libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 8,
                };
                assert_eq!(libc::process_vm_writev(pid, &local, 1, &remote, 1, 0), -1);
                assert_eq!(errno(), Some(libc::EPERM), "process_vm_writev");
                assert_eq!(libc::process_vm_readv(pid, &local, 1, &remote, 1, 0), -1);
                assert_eq!(errno(), Some(libc::EPERM), "process_vm_readv");
                let (src, dst, fs) = (c"none", c"/nonexistent-lagtrace", c"tmpfs");
                assert_eq!(
                    libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()),
                    -1
                );
                assert_eq!(errno(), Some(libc::EPERM), "mount");
                assert_eq!(libc::umount2(dst.as_ptr(), 0), -1);
                assert_eq!(errno(), Some(libc::EPERM), "umount2");
                assert_eq!(libc::syscall(libc::SYS_userfaultfd, 0), -1);
                assert_eq!(errno(), Some(libc::EPERM), "userfaultfd");
                assert!(libc::getpid() > 0);
            }
            assert!(std::fs::read_to_string("/proc/self/status").is_ok());
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            assert!(status.contains("Seccomp:\t2"), "{status}");
        })
        .join()
        .expect("the filtered thread");
        drop(other);
        // The harness's own thread is unfiltered.
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        assert!(status.contains("Seccomp:\t0"), "{status}");
    }

    #[test]
    fn the_program_fits_and_names_each_call_once() {
        let p = program().expect("the program");
        assert!(p.len() < 512, "{} instructions", p.len());
        let mut nrs: Vec<i64> = DENIED.iter().map(|d| d.1).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), DENIED.len());
    }
}
