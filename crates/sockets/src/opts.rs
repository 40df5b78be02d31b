//! Reading another process's socket options without stopping it: `pidfd_open` +
//! `pidfd_getfd` give us a duplicate of its descriptor (same open file, same socket);
//! `getsockopt` on the duplicate reads the options; the duplicate is closed at once
//! (close only drops our reference; it is never shut down).
//!
//! Needs PTRACE_MODE_ATTACH_REALCREDS over the target: CAP_SYS_PTRACE, or the same uid
//! (and Yama's ptrace_scope allowing it).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use serde::{Deserialize, Serialize};

/// Options only the socket's owner can read. `None`: that getsockopt failed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SocketOptions {
    /// TCP_NODELAY: Nagle's algorithm is off when true.
    pub nodelay: Option<bool>,
    /// TCP_CORK: partial frames are held (up to 200 ms) when true.
    pub cork: Option<bool>,
    /// TCP_QUICKACK read back: the *current* ACK mode (true = quick ACK now), not a
    /// setting — the kernel leaves quick-ACK mode by itself.
    pub quickack_mode: Option<bool>,
    /// SO_SNDBUF in bytes (the kernel's doubled value).
    pub sndbuf: Option<u32>,
    /// SO_RCVBUF in bytes (the kernel's doubled value).
    pub rcvbuf: Option<u32>,
    /// TCP_NOTSENT_LOWAT (0 = unlimited / sysctl default).
    pub notsent_lowat: Option<u32>,
    /// SO_KEEPALIVE.
    pub keepalive: Option<bool>,
    /// TCP_MAXSEG.
    pub maxseg: Option<u32>,
    /// TCP_USER_TIMEOUT in µs (the kernel's ms × 1000; 0 = system default).
    pub user_timeout_us: Option<u64>,
}

fn getsockopt_int(fd: i32, level: i32, name: i32) -> Option<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: v and len are valid for the call.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &raw mut len) };
    (rc == 0).then_some(v)
}

/// Reads the options of an open socket descriptor of our own.
pub fn read_options(fd: i32) -> SocketOptions {
    let b = |l, n| getsockopt_int(fd, l, n).map(|v| v != 0);
    let u = |l, n| getsockopt_int(fd, l, n).map(|v| v as u32);
    SocketOptions {
        nodelay: b(libc::IPPROTO_TCP, libc::TCP_NODELAY),
        cork: b(libc::IPPROTO_TCP, libc::TCP_CORK),
        quickack_mode: b(libc::IPPROTO_TCP, libc::TCP_QUICKACK),
        sndbuf: u(libc::SOL_SOCKET, libc::SO_SNDBUF),
        rcvbuf: u(libc::SOL_SOCKET, libc::SO_RCVBUF),
        notsent_lowat: u(libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
        keepalive: b(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        maxseg: u(libc::IPPROTO_TCP, libc::TCP_MAXSEG),
        user_timeout_us: u(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT)
            .map(|ms| u64::from(ms) * 1000),
    }
}

/// Why another process's descriptor could not be duplicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DupError {
    /// The process is gone (exited before or during the scan).
    Gone,
    /// The descriptor was closed or replaced meanwhile.
    FdGone,
    /// No ptrace rights over the process.
    Permission,
    /// The kernel has no pidfd_getfd (before Linux 5.6).
    Unsupported,
    /// Anything else.
    Other(String),
}

/// A pidfd on a process, kept for several `getfd` calls.
pub struct PidFd(OwnedFd);

impl PidFd {
    /// `pidfd_open(pid, 0)`.
    pub fn open(pid: u32) -> Result<PidFd, DupError> {
        // SAFETY: plain syscall with integer arguments.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => DupError::Gone,
                Some(libc::ENOSYS) => DupError::Unsupported,
                Some(libc::EPERM) => DupError::Permission,
                _ => DupError::Other(e.to_string()),
            });
        }
        // SAFETY: the syscall returned a new descriptor we now own.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(r as i32) }))
    }

    /// `pidfd_getfd(pidfd, fd, 0)`: a duplicate of the target's descriptor, closed on drop.
    pub fn getfd(&self, fd: i32) -> Result<OwnedFd, DupError> {
        // SAFETY: plain syscall with integer arguments.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.0.as_raw_fd(), fd, 0u32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => DupError::Gone,
                Some(libc::EBADF) => DupError::FdGone,
                Some(libc::EPERM) => DupError::Permission,
                Some(libc::ENOSYS) => DupError::Unsupported,
                _ => DupError::Other(e.to_string()),
            });
        }
        // SAFETY: the syscall returned a new descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }
}

/// The inode of a socket descriptor (to check that the duplicate is the expected socket).
pub fn fd_inode(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is valid.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) };
    (rc == 0).then_some(st.st_ino)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn own_socket_through_pidfd() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_tcp_nodelay(true).unwrap();
        s.set_send_buffer_size(65536).unwrap();
        let pfd = PidFd::open(std::process::id()).unwrap();
        let dup = pfd.getfd(s.as_raw_fd()).unwrap();
        let o = read_options(dup.as_raw_fd());
        assert_eq!(o.nodelay, Some(true));
        assert_eq!(o.cork, Some(false));
        assert_eq!(o.sndbuf, Some(131072));
        assert_eq!(pfd.getfd(987_654).unwrap_err(), DupError::FdGone);
    }
}
