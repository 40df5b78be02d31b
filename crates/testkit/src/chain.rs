//! A chain of network namespaces `client → r1 → r2 → server` joined by veth pairs, with
//! forwarding on the routers and routes both ways (IPv4 and IPv6). Needs root. Every
//! namespace made is deleted by the chain's [`NetGuard`], even when the test panics.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::net::NetGuard;
use crate::{in_ns, try_in_ns};

/// The four-namespace chain. Addresses: link k (0 = client–r1, 1 = r1–r2, 2 = r2–server) is
/// 10.A.B+k.0/24 with .1 on the left end and .2 on the right end.
pub struct Chain {
    /// Namespace names: client, r1, r2, server.
    pub ns: [String; 4],
    a: u8,
    b: u8,
    /// Deletes the namespaces (and with them their veths, qdiscs and nft tables).
    guard: NetGuard,
}

impl Chain {
    /// Builds the chain; `tag` (e.g. the test name), the pid and a counter make the names
    /// unique. Panics (after removing what it made) when a step fails.
    pub fn up(tag: &str) -> Chain {
        let pid = std::process::id();
        let h = tag.bytes().fold(
            pid.wrapping_mul(2654435761) ^ crate::unique().wrapping_mul(40503),
            |h, c| h.rotate_left(5) ^ u32::from(c),
        );
        let short: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(6)
            .collect();
        let base = crate::unique_name(&format!("lt{short}"), 40);
        let ns = ["c", "r1", "r2", "s"].map(|r| format!("{base}{r}"));
        // 10.(100..=227).(0..=252 step 4).x: distinct /24s per chain, unlikely to collide.
        let a = 100 + (h >> 8) as u8 % 128;
        let b = ((h >> 16) as u8 % 63) * 4;
        let mut chain = Chain {
            ns,
            a,
            b,
            guard: NetGuard::new(),
        };
        chain.build();
        chain
    }

    fn build(&mut self) {
        for n in &self.ns {
            self.guard.add_ns_named(n);
        }
        for k in 0..3 {
            let (l, r) = (&self.ns[k], &self.ns[k + 1]);
            let (li, ri) = (format!("v{k}l"), format!("v{k}r"));
            crate::sh(&[
                "ip", "link", "add", &li, "netns", l, "type", "veth", "peer", "name", &ri, "netns",
                r,
            ]);
            in_ns(
                l,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", self.addr(k, 1)),
                    "dev",
                    &li,
                ],
            );
            in_ns(
                r,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/24", self.addr(k, 2)),
                    "dev",
                    &ri,
                ],
            );
            in_ns(
                l,
                &[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/64", self.addr6(k, 1)),
                    "dev",
                    &li,
                    "nodad",
                ],
            );
            in_ns(
                r,
                &[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/64", self.addr6(k, 2)),
                    "dev",
                    &ri,
                    "nodad",
                ],
            );
            in_ns(l, &["ip", "link", "set", &li, "up"]);
            in_ns(r, &["ip", "link", "set", &ri, "up"]);
        }
        for r in [&self.ns[1], &self.ns[2]] {
            in_ns(r, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            in_ns(r, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        }
        // Linux rate-limits ICMP errors per destination (burst 6, then 1/s); a test runs
        // several traces back to back, so the routers and the server do not limit.
        for n in &self.ns[1..] {
            in_ns(n, &["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"]);
            in_ns(n, &["sysctl", "-qw", "net.ipv6.icmp.ratelimit=0"]);
        }
        in_ns(
            &self.ns[0],
            &[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &self.addr(0, 2).to_string(),
            ],
        );
        in_ns(
            &self.ns[3],
            &[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &self.addr(2, 1).to_string(),
            ],
        );
        in_ns(
            &self.ns[1],
            &[
                "ip",
                "route",
                "add",
                &self.net(2),
                "via",
                &self.addr(1, 2).to_string(),
            ],
        );
        in_ns(
            &self.ns[2],
            &[
                "ip",
                "route",
                "add",
                &self.net(0),
                "via",
                &self.addr(1, 1).to_string(),
            ],
        );
        let via6 = |k: usize, end: u8| self.addr6(k, end).to_string();
        in_ns(
            &self.ns[0],
            &["ip", "-6", "route", "add", "default", "via", &via6(0, 2)],
        );
        in_ns(
            &self.ns[3],
            &["ip", "-6", "route", "add", "default", "via", &via6(2, 1)],
        );
        in_ns(
            &self.ns[1],
            &[
                "ip",
                "-6",
                "route",
                "add",
                &self.net6(2),
                "via",
                &via6(1, 2),
            ],
        );
        in_ns(
            &self.ns[2],
            &[
                "ip",
                "-6",
                "route",
                "add",
                &self.net6(0),
                "via",
                &via6(1, 1),
            ],
        );
        // IPv6 is usable once no address is tentative (link-local DAD runs even with nodad).
        let t0 = std::time::Instant::now();
        while self.ns.iter().any(|n| {
            try_in_ns(n, &["ip", "-6", "addr", "show", "tentative"])
                .is_ok_and(|o| !o.trim().is_empty())
        }) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "IPv6 addresses still tentative after 5 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Address of the left (`end = 1`) or right (`end = 2`) end of link `k`.
    pub fn addr(&self, k: usize, end: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.a, self.b + k as u8, end)
    }

    /// IPv6 address of an end of link `k` (fd00:A:B+k::1 / ::2).
    pub fn addr6(&self, k: usize, end: u8) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfd00,
            u16::from(self.a),
            u16::from(self.b) + k as u16,
            0,
            0,
            0,
            0,
            u16::from(end),
        )
    }

    fn net6(&self, k: usize) -> String {
        format!("fd00:{:x}:{:x}::/64", self.a, u16::from(self.b) + k as u16)
    }

    fn net(&self, k: usize) -> String {
        format!("10.{}.{}.0/24", self.a, self.b + k as u8)
    }

    /// The client's address.
    pub fn client(&self) -> Ipv4Addr {
        self.addr(0, 1)
    }
    /// r1's address facing the client (what a time exceeded from r1 comes from).
    pub fn r1(&self) -> Ipv4Addr {
        self.addr(0, 2)
    }
    /// r2's address facing r1.
    pub fn r2(&self) -> Ipv4Addr {
        self.addr(1, 2)
    }
    /// The server's address.
    pub fn server(&self) -> Ipv4Addr {
        self.addr(2, 2)
    }
    /// Name of the client namespace.
    pub fn client_ns(&self) -> &str {
        &self.ns[0]
    }
    /// Name of the server namespace.
    pub fn server_ns(&self) -> &str {
        &self.ns[3]
    }
    /// Waits (at most 10 s) until a TCP connect from the client namespace to `host:port`
    /// succeeds: a server just started in the server namespace is listening and routed.
    pub fn wait_reachable_from_client(&self, host: &str, port: u16) {
        let ready = || {
            std::process::Command::new("ip")
                .args(["netns", "exec", self.client_ns(), "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let t = std::time::Instant::now();
        while !ready() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "{host}:{port} not reachable from {}",
                self.client_ns()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The r1 end of the r1–r2 link (shape here for the r1→r2 direction).
    pub fn r1_to_r2_dev(&self) -> (&str, &str) {
        (&self.ns[1], "v1l")
    }
}
