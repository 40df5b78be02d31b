//! Which listener serves a connection: one rule for every layer that names the server's
//! process (the sockets layer, the host layer, the agent's), so that a second listener on
//! the same port — another address, another process — is never taken for the server.
//!
//! The kernel's own lookup (`inet_lhash2_lookup`'s score): a listener bound to the
//! connection's destination address wins over a wildcard one; a wildcard of the
//! connection's own family over `::` taking IPv4 through its mapped addresses. A listener
//! bound to a loopback address takes only connections to that address: never a caller's
//! from another host.

use std::net::{IpAddr, SocketAddr};

/// What is known of the connections a server is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// The address the clients connect to (a diagnose with the server's URL).
    To(IpAddr),
    /// Only the address they connect from (the agent knows its caller, not which of its
    /// host's addresses the caller used).
    From(IpAddr),
    /// Nothing: every listener on the port.
    Any,
}

/// How well a listener bound to `local` takes a connection to `dest` (higher wins, as in
/// the kernel's lookup); `None`: it would not take it. The port is the caller's to match.
pub fn score(local: SocketAddr, dest: Dest) -> Option<u8> {
    let l = local.ip().to_canonical();
    let wildcard = local.ip().is_unspecified();
    match dest {
        Dest::To(d) => {
            let d = d.to_canonical();
            if !wildcard {
                (l == d).then_some(3)
            } else if local.is_ipv4() == d.is_ipv4() {
                Some(2)
            } else {
                // `::` takes IPv4 (unless IPV6_V6ONLY); `0.0.0.0` never takes IPv6.
                (local.is_ipv6() && d.is_ipv4()).then_some(1)
            }
        }
        Dest::From(peer) => {
            let p = peer.to_canonical();
            if wildcard {
                Some(1)
            } else if l.is_loopback() && !p.is_loopback() {
                None
            } else {
                Some(2)
            }
        }
        Dest::Any => Some(1),
    }
}

/// The listeners among `items` (each one's local address through `local`) on `port` that
/// serve `dest`: those with the best [`score`] (several under SO_REUSEPORT).
pub fn serving<T>(items: &[T], local: impl Fn(&T) -> SocketAddr, port: u16, dest: Dest) -> Vec<&T> {
    let scored: Vec<(u8, &T)> = items
        .iter()
        .filter(|t| local(t).port() == port)
        .filter_map(|t| score(local(t), dest).map(|s| (s, t)))
        .collect();
    let best = scored.iter().map(|(s, _)| *s).max();
    scored
        .into_iter()
        .filter(|(s, _)| Some(*s) == best)
        .map(|(_, t)| t)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_kernels_preference_decides_between_listeners_on_one_port() {
        let ls = [
            sa("127.0.0.1:80"),
            sa("10.0.0.1:80"),
            sa("0.0.0.0:8080"),
            sa("[::]:8080"),
            sa("10.0.0.2:8080"),
        ];
        let to = |a: &str| Dest::To(a.parse().unwrap());
        let from = |a: &str| Dest::From(a.parse().unwrap());
        let pick = |port, d| serving(&ls, |s| *s, port, d);
        assert_eq!(pick(80, to("10.0.0.1")), [&ls[1]]);
        assert_eq!(pick(80, to("127.0.0.1")), [&ls[0]]);
        assert!(pick(80, to("10.0.0.9")).is_empty(), "no listener takes it");
        // A caller from another host never reaches a loopback listener.
        assert_eq!(pick(80, from("10.0.0.7")), [&ls[1]]);
        assert_eq!(pick(8080, to("10.0.0.2")), [&ls[4]], "exact over wildcard");
        assert_eq!(
            pick(8080, to("10.0.0.3")),
            [&ls[2]],
            "own family's wildcard first"
        );
        assert_eq!(pick(8080, to("fd00::1")), [&ls[3]]);
        assert_eq!(
            pick(8080, to("::ffff:10.0.0.2")),
            [&ls[4]],
            "a mapped address"
        );
        assert_eq!(pick(80, Dest::Any).len(), 2);
    }
}
