//! One netlink dump, written once: the socket, the request, and the receive loop. The callers
//! (sock_diag here, rtnetlink's qdisc dump in the host layer) build the request's body and
//! parse the datagrams; this module knows only the netlink header.

use std::io;

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 1;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// Length of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

struct NlSocket(i32);

impl Drop for NlSocket {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own.
        unsafe { libc::close(self.0) };
    }
}

/// A dump request: the netlink header (`ty`, `NLM_F_REQUEST | NLM_F_DUMP`, `seq`) then `body`.
pub fn dump_request(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// Sends `request` on a new netlink socket of `protocol` (in the calling thread's network
/// namespace) and hands each datagram of the answer to `batch` until it says the dump is over
/// (or the kernel closes it).
pub fn dump(
    protocol: i32,
    request: &[u8],
    mut batch: impl FnMut(&[u8]) -> io::Result<bool>,
) -> io::Result<()> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let sock = NlSocket(fd);
    // SAFETY: the kernel is the destination (zeroed sockaddr_nl); request is a valid buffer.
    let sent = unsafe {
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            sock.0,
            request.as_ptr().cast(),
            request.len(),
            0,
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(sock.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 || batch(&buf[..n as usize])? {
            return Ok(());
        }
    }
}
