//! Listening sockets sampled over the window through sock_diag: accept-queue length
//! (`recv_q` of a listener) against its limit (`send_q`), and the listener's own drop count
//! (`sk_drops`, which `tcp_listendrop` raises on every accept-queue overflow and listen drop).

use std::collections::{BTreeMap, HashSet};
use std::io;

use lagtrace_model::host::ListenerQueue;
use lagtrace_sockets::diag::{self, DiagSocket};

const TCP_LISTEN: u32 = 10;

#[derive(Debug, Clone)]
struct Track {
    local: String,
    max: u32,
    current: u32,
    peak: u32,
    samples: u32,
    full: u32,
    drops_first: Option<u32>,
    drops_last: Option<u32>,
}

/// Listeners seen over the window, by inode.
#[derive(Debug, Default)]
pub struct ListenTrack {
    /// With a process: its listeners' inodes, and the namespace's other listeners.
    pid: Option<u32>,
    mine: HashSet<u64>,
    others: HashSet<u64>,
    seen: BTreeMap<u64, Track>,
}

impl ListenTrack {
    /// Tracks every listener of the namespace, or with `pid` only those the process holds.
    pub fn new(pid: Option<u32>) -> ListenTrack {
        ListenTrack {
            pid,
            ..ListenTrack::default()
        }
    }

    /// One sock_diag reading of the calling thread's namespace.
    pub fn sample(&mut self) -> io::Result<()> {
        let socks = diag::dump_tcp(1 << TCP_LISTEN)?;
        if let Some(pid) = self.pid {
            // A listener not seen before (the process may open it during the window):
            // look at the process's descriptors again.
            if socks
                .iter()
                .any(|s| !self.mine.contains(&s.inode) && !self.others.contains(&s.inode))
            {
                self.mine = owners(&[pid]).into_keys().collect();
                for s in &socks {
                    if !self.mine.contains(&s.inode) {
                        self.others.insert(s.inode);
                    }
                }
            }
        }
        self.add(&socks);
        Ok(())
    }

    /// Adds one reading.
    pub fn add(&mut self, socks: &[DiagSocket]) {
        for s in socks {
            if s.state != TCP_LISTEN as u8 || (self.pid.is_some() && !self.mine.contains(&s.inode))
            {
                continue;
            }
            let drops = s.skmem.as_ref().and_then(|m| m.drops);
            let t = self.seen.entry(s.inode).or_insert_with(|| Track {
                local: s.local.to_string(),
                max: s.send_q,
                current: 0,
                peak: 0,
                samples: 0,
                full: 0,
                drops_first: drops,
                drops_last: drops,
            });
            t.max = s.send_q;
            t.current = s.recv_q;
            t.peak = t.peak.max(s.recv_q);
            t.samples += 1;
            if s.recv_q > s.send_q {
                t.full += 1;
            }
            t.drops_last = drops;
        }
    }

    /// The listeners, with owners from `owners` (inode → `pid/comm` labels).
    pub fn finish(self, owners: &BTreeMap<u64, Vec<String>>) -> Vec<ListenerQueue> {
        self.seen
            .into_iter()
            .map(|(inode, t)| ListenerQueue {
                local: t.local,
                inode,
                owners: owners.get(&inode).cloned().unwrap_or_default(),
                max: t.max,
                current: t.current,
                peak: t.peak,
                samples: t.samples,
                full_samples: t.full,
                drops: t
                    .drops_last
                    .zip(t.drops_first)
                    .map(|(a, b)| u64::from(a.wrapping_sub(b))),
            })
            .collect()
    }
}

/// Socket inode → `pid/comm` of the processes in `pids` that hold it.
pub fn owners(pids: &[u32]) -> BTreeMap<u64, Vec<String>> {
    lagtrace_sockets::procfs::scan_fds(pids)
        .owners
        .into_iter()
        .map(|(inode, v)| {
            let mut labels: Vec<String> =
                v.iter().map(|o| format!("{}/{}", o.pid, o.comm)).collect();
            labels.sort();
            labels.dedup();
            (inode, labels)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_filter_keeps_only_its_listeners_and_counts_full_samples() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut all = ListenTrack::new(None);
        all.sample().unwrap();
        let mine = owners(&[std::process::id()]);
        let got = all.finish(&mine);
        let me = got
            .iter()
            .find(|q| q.local.ends_with(&format!(":{port}")))
            .expect("own listener");
        assert!(me.owners[0].starts_with(&format!("{}/", std::process::id())));
        assert_eq!((me.current, me.full_samples), (0, 0));
        let mut only_mine = ListenTrack::new(Some(std::process::id()));
        only_mine.sample().unwrap();
        let got = only_mine.finish(&mine);
        assert!(got.iter().any(|q| q.inode == me.inode), "{got:?}");
        assert!(got.iter().all(|q| mine.contains_key(&q.inode)), "{got:?}");
        // A process with no listeners has none, whatever the namespace has.
        let mut none = ListenTrack::new(Some(1));
        none.sample().unwrap();
        assert!(none.finish(&mine).is_empty());
    }
}
