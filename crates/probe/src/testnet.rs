//! Test support: a chain of network namespaces `client → r1 → r2 → server` joined by veth
//! pairs, with forwarding on the routers and routes both ways. Needs root. Every namespace
//! made is deleted by [`Chain`]'s `Drop`, even when the test panics. Public so that the
//! binary's integration tests can use it too; not for production use.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, bail};

/// Runs `ip`/`tc`/`nft` style commands, failing with the command line and its stderr.
pub fn sh(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip netns exec NS args...`
pub fn in_ns(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v)
}

/// The four-namespace chain. Addresses: link k (0 = client–r1, 1 = r1–r2, 2 = r2–server) is
/// 10.A.B+k.0/24 with .1 on the left end and .2 on the right end.
pub struct Chain {
    /// Namespace names: client, r1, r2, server.
    pub ns: [String; 4],
    a: u8,
    b: u8,
}

impl Chain {
    /// Builds the chain; `tag` (e.g. the test name) plus the pid make the names unique.
    pub fn up(tag: &str) -> anyhow::Result<Chain> {
        let pid = std::process::id();
        let h = tag.bytes().fold(pid.wrapping_mul(2654435761), |h, c| {
            h.rotate_left(5) ^ u32::from(c)
        });
        let short: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(6)
            .collect();
        let base = format!("lt{short}{:x}", h & 0xfffff);
        let ns = ["c", "r1", "r2", "s"].map(|r| format!("{base}{r}"));
        // 10.(100..=227).(0..=252 step 4).x: distinct /24s per chain, unlikely to collide.
        let a = 100 + (h >> 8) as u8 % 128;
        let b = ((h >> 16) as u8 % 63) * 4;
        let chain = Chain { ns, a, b };
        chain
            .build()
            .with_context(|| format!("building namespace chain {base}"))?;
        Ok(chain)
    }

    fn build(&self) -> anyhow::Result<()> {
        for n in &self.ns {
            sh(&["ip", "netns", "add", n])?;
            in_ns(n, &["ip", "link", "set", "lo", "up"])?;
        }
        for k in 0..3 {
            let (l, r) = (&self.ns[k], &self.ns[k + 1]);
            let (li, ri) = (format!("v{k}l"), format!("v{k}r"));
            sh(&[
                "ip", "link", "add", &li, "netns", l, "type", "veth", "peer", "name", &ri, "netns",
                r,
            ])?;
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
            )?;
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
            )?;
            in_ns(l, &["ip", "link", "set", &li, "up"])?;
            in_ns(r, &["ip", "link", "set", &ri, "up"])?;
        }
        for r in [&self.ns[1], &self.ns[2]] {
            in_ns(r, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
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
        )?;
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
        )?;
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
        )?;
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
        )?;
        Ok(())
    }

    /// Address of the left (`end = 1`) or right (`end = 2`) end of link `k`.
    pub fn addr(&self, k: usize, end: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.a, self.b + k as u8, end)
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
    /// The r1 end of the r1–r2 link (shape here for the r1→r2 direction).
    pub fn r1_to_r2_dev(&self) -> (&str, &str) {
        (&self.ns[1], "v1l")
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        for n in &self.ns {
            // Deleting a namespace deletes its veths, qdiscs and nft tables with it.
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
