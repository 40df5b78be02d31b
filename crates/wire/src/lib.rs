//! lagtrace-wire: the wire formats both capture analysis (`lagtrace-packet`) and the probes
//! (`lagtrace-probe`) read, written once. No libpcap, no sockets: bytes in, typed values out.
//!
//! Shape after smoltcp's `wire` module: a zero-copy view over `T: AsRef<[u8]>` whose
//! `new_checked` does the one length check that makes every accessor safe on hostile input;
//! byte offsets live once in a `field` module; tests with byte-array fixtures at the bottom
//! of each file. Where etherparse has the type (IPv4 headers, TCP headers) it is used.
//!
//! - [`tcp`]: the TCP flag bits and their hping3-style letters.
//! - [`icmp`]: ICMPv4 and ICMPv6 echo replies and errors, one parser generic over the
//!   version ([`icmp::V4`], [`icmp::V6`]).
#![deny(missing_docs)]

pub mod icmp;
pub mod tcp;

/// Big-endian u16 at `at`; the caller has checked the length.
#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
