//! The one guard for what a test builds in the network stack, and a namespace joined to
//! this one by a veth pair.
//!
//! [`NetGuard`] records each namespace, host-side link, host nft table and helper process
//! only once it exists, and its `Drop` removes exactly those (processes first, then tables,
//! links and namespaces), even when the test panics. It never touches what it did not make.

use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

use crate::{in_ns, sh, unique_name};

/// What one test made; removed on drop.
#[derive(Default)]
pub struct NetGuard {
    namespaces: Vec<String>,
    links: Vec<String>,
    nft_tables: Vec<(String, String)>,
    children: Vec<Child>,
}

impl NetGuard {
    /// An empty guard.
    pub fn new() -> NetGuard {
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(sweep_dead_owners);
        NetGuard::default()
    }

    /// Creates a namespace with a unique name starting `lt-{tag}-` and loopback up.
    pub fn add_ns(&mut self, tag: &str) -> String {
        let name = unique_name(&format!("lt-{tag}-"), 64);
        self.add_ns_named(&name);
        name
    }

    /// Creates the namespace `name` (the caller made the name unique) with loopback up.
    pub fn add_ns_named(&mut self, name: &str) {
        sh(&["ip", "netns", "add", name]);
        note_owner(name);
        self.namespaces.push(name.to_string());
        in_ns(name, &["ip", "link", "set", "lo", "up"]);
    }

    /// Creates a veth pair: `host` in this namespace (removed on drop) and `peer` inside
    /// namespace `ns` (removed with the namespace).
    pub fn add_veth(&mut self, host: &str, peer: &str, ns: &str) {
        sh(&[
            "ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns,
        ]);
        self.links.push(host.to_string());
    }

    /// Records an nft table (`family`, `name`) the test loaded in this namespace.
    pub fn own_nft_table(&mut self, family: &str, name: &str) {
        self.nft_tables.push((family.to_string(), name.to_string()));
    }

    /// Records a helper process (a tcpdump, a server): killed on drop if still running.
    pub fn own_child(&mut self, child: Child) {
        self.children.push(child);
    }

    /// Hands back the recorded processes (e.g. to stop them gracefully).
    pub fn take_children(&mut self) -> Vec<Child> {
        std::mem::take(&mut self.children)
    }
}

/// Where the kit notes which process made each test namespace (a file per namespace holding
/// the maker's pid), so that the namespaces of a test binary killed before its guards ran
/// can be told from anyone else's.
const OWNERS: &str = "/run/lagtrace-testkit";

fn note_owner(ns: &str) {
    let _ = std::fs::create_dir_all(OWNERS);
    let _ = std::fs::write(format!("{OWNERS}/{ns}"), std::process::id().to_string());
}

/// Removes the test namespaces whose maker is gone (SIGKILL, a CI timeout), with the
/// processes still running inside them — which only a test of that binary started. Only
/// namespaces this kit noted are touched; one whose maker still lives is left alone.
fn sweep_dead_owners() {
    let Ok(dir) = std::fs::read_dir(OWNERS) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = std::fs::read_to_string(e.path()).unwrap_or_default();
        let pid = pid.trim();
        if pid.parse::<u32>().is_ok() && std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(o) = Command::new("ip").args(["netns", "pids", &name]).output() {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", p]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(e.path());
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let quiet = |args: &[&str]| {
            let _ = Command::new(args[0])
                .args(&args[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        for (family, name) in self.nft_tables.iter().rev() {
            quiet(&["nft", "delete", "table", family, name]);
        }
        for l in self.links.iter().rev() {
            quiet(&["ip", "link", "del", l]);
        }
        // Deleting a namespace deletes its links, qdiscs and nft tables with it.
        for n in self.namespaces.iter().rev() {
            quiet(&["ip", "netns", "del", n]);
            let _ = std::fs::remove_file(format!("{OWNERS}/{n}"));
        }
    }
}

/// A namespace joined to this one by a veth pair, both ends addressed and up.
pub struct VethNs {
    /// The namespace's name.
    pub netns: String,
    /// Host end of the veth pair.
    pub veth: String,
    /// Namespace end of the veth pair.
    pub peer: String,
    /// Everything made, and whatever the test adds (tcpdumps, host nft tables).
    pub guard: NetGuard,
}

impl VethNs {
    /// Creates a namespace and a veth pair (unique names from `tag`), addresses `host_cidr`
    /// here and `ns_cidr` inside (with `nodad` when `nodad`), all links up.
    pub fn up(tag: &str, host_cidr: &str, ns_cidr: &str, nodad: bool) -> VethNs {
        let mut guard = NetGuard::new();
        let netns = guard.add_ns(tag);
        let short = unique_name("lt", 13);
        let (veth, peer) = (format!("{short}h"), format!("{short}n"));
        guard.add_veth(&veth, &peer, &netns);
        let mut add = vec!["ip", "addr", "add", host_cidr, "dev", veth.as_str()];
        if nodad {
            add.push("nodad");
        }
        sh(&add);
        sh(&["ip", "link", "set", &veth, "up"]);
        let mut add = vec!["ip", "addr", "add", ns_cidr, "dev", peer.as_str()];
        if nodad {
            add.push("nodad");
        }
        in_ns(&netns, &add);
        in_ns(&netns, &["ip", "link", "set", &peer, "up"]);
        VethNs {
            netns,
            veth,
            peer,
            guard,
        }
    }
}

/// Loads an nft ruleset from `rules` (`nft -f -`), inside `netns` if given.
pub fn nft_load(netns: Option<&str>, rules: &str) {
    use std::io::Write;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    let nft = cmd
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().map(|mut s| s.write_all(rules.as_bytes()));
            c.wait()
        })
        .expect("run nft");
    assert!(nft.success(), "nft -f - failed on:\n{rules}");
}

/// Moves the calling thread into the network namespace `netns` (by name).
pub fn enter_netns(netns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{netns}")).expect("open netns");
    // SAFETY: setns on a valid namespace fd only changes this thread's network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root"]
    fn a_namespace_whose_maker_died_is_swept_and_a_living_makers_is_kept() {
        let dead = Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        let _ = { dead }.wait();
        let (gone, kept) = (unique_name("lt-swept-", 64), unique_name("lt-kept-", 64));
        let mut g = NetGuard::new();
        g.add_ns_named(&kept);
        sh(&["ip", "netns", "add", &gone]);
        std::fs::write(format!("{OWNERS}/{gone}"), dead_pid.to_string()).unwrap();
        // Not noted by the kit: never touched, whoever made it.
        let foreign = unique_name("lt-foreign-", 64);
        sh(&["ip", "netns", "add", &foreign]);
        sweep_dead_owners();
        let list = sh(&["ip", "netns", "list"]);
        let _ = Command::new("ip").args(["netns", "del", &foreign]).status();
        let names: Vec<&str> = list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(!names.contains(&gone.as_str()), "{list}");
        assert!(names.contains(&kept.as_str()), "{list}");
        assert!(names.contains(&foreign.as_str()), "{list}");
    }
}
