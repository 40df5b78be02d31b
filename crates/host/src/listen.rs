//! Listening sockets sampled over the window through sock_diag: accept-queue length
//! (`recv_q` of a listener) against its limit (`send_q`), the listener's own drop count
//! (`sk_drops`, which `tcp_listendrop` raises on every accept-queue overflow and listen drop),
//! and its SYN queue: the half-open request sockets (`NEW_SYN_RECV`) to its port, counted with
//! their distinct source addresses (a SYN flood from spoofed sources fills the queue from as
//! many addresses as it has entries; a client's burst of connects from one).

use std::collections::{BTreeMap, HashSet};
use std::io;

use lagtrace_model::host::ListenerQueue;
use lagtrace_sockets::diag::{self, DiagSocket};

const TCP_LISTEN: u32 = 10;
/// A request socket of a listener's SYN queue; older kernels (before 4.4) listed them as
/// `SYN_RECV` (3).
const TCP_NEW_SYN_RECV: u32 = 12;
const TCP_SYN_RECV: u32 = 3;

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
    /// The most half-open connections to it in one sample, and their distinct sources.
    half_open: Option<(u32, u32)>,
}

/// Listeners seen over the window, by inode.
#[derive(Debug, Default)]
pub struct ListenTrack {
    /// With a process: its listeners' inodes, and the namespace's other listeners.
    pid: Option<u32>,
    mine: HashSet<u64>,
    others: HashSet<u64>,
    seen: BTreeMap<u64, Track>,
    /// Readings so far.
    readings: u32,
}

/// Every how many readings the half-open request sockets are dumped too. Listing them makes
/// the kernel walk the whole established hash (every bucket, ~1 ms a dump here) where the
/// listeners alone walk only the listening hash: at one reading in five (every ~500 ms) a
/// SYN queue held full by a flood is still seen, for a fifth of the cost.
const HALF_OPEN_EVERY: u32 = 5;

impl ListenTrack {
    /// Tracks every listener of the namespace, or with `pid` only those the process holds.
    pub fn new(pid: Option<u32>) -> ListenTrack {
        ListenTrack {
            pid,
            ..ListenTrack::default()
        }
    }

    /// One sock_diag reading of the calling thread's namespace: its listeners, and (the
    /// first reading and every [`HALF_OPEN_EVERY`]th) their half-open connections.
    pub fn sample(&mut self) -> io::Result<()> {
        let half_open = self.readings.is_multiple_of(HALF_OPEN_EVERY);
        self.readings += 1;
        let states = if half_open {
            (1 << TCP_LISTEN) | (1 << TCP_SYN_RECV) | (1 << TCP_NEW_SYN_RECV)
        } else {
            1 << TCP_LISTEN
        };
        let socks = diag::dump_tcp(states)?;
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
        let half_open: Vec<&DiagSocket> = socks
            .iter()
            .filter(|s| {
                u32::from(s.state) == TCP_NEW_SYN_RECV || u32::from(s.state) == TCP_SYN_RECV
            })
            .collect();
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
                half_open: None,
            });
            t.max = s.send_q;
            t.current = s.recv_q;
            t.peak = t.peak.max(s.recv_q);
            t.samples += 1;
            if s.recv_q > s.send_q {
                t.full += 1;
            }
            t.drops_last = drops;
            // The listener's half-open connections: to its port, on its address (any, for a
            // wildcard listener).
            let mine = half_open.iter().filter(|h| {
                h.local.port() == s.local.port()
                    && (s.local.ip().is_unspecified()
                        || h.local.ip().to_canonical() == s.local.ip().to_canonical())
            });
            let (mut n, mut sources) = (0u32, HashSet::new());
            for h in mine {
                n += 1;
                sources.insert(h.remote.ip().to_canonical());
            }
            let sources = u32::try_from(sources.len()).unwrap_or(u32::MAX);
            if t.half_open.is_none_or(|(peak, _)| n > peak) {
                t.half_open = Some((n, sources));
            }
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
                half_open_peak: t.half_open.map(|h| h.0),
                half_open_sources: t.half_open.map(|h| h.1),
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

    fn sock(state: u32, local: &str, remote: &str, inode: u64) -> DiagSocket {
        DiagSocket {
            state: state as u8,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            inode,
            uid: 0,
            recv_q: 0,
            send_q: 511,
            tcp_info: None,
            congestion: None,
            skmem: None,
        }
    }

    /// A wildcard listener's SYN queue is every half-open connection to its port; another
    /// port's are not its, and the fullest sample is kept with its distinct sources.
    #[test]
    fn half_open_connections_are_counted_per_listener_with_their_sources() {
        let mut t = ListenTrack::new(None);
        let listener = sock(TCP_LISTEN, "0.0.0.0:8080", "0.0.0.0:0", 9);
        let mut first = vec![listener.clone()];
        for k in 0..3 {
            first.push(sock(
                TCP_NEW_SYN_RECV,
                "10.0.0.2:8080",
                &format!("10.0.0.1:{}", 40_000 + k),
                0,
            ));
        }
        t.add(&first);
        let mut flood = vec![listener];
        for k in 0..40u32 {
            flood.push(sock(
                TCP_SYN_RECV,
                "10.0.0.2:8080",
                &format!("198.18.{}.{}:1234", k / 200, k % 200 + 1),
                0,
            ));
        }
        flood.push(sock(TCP_NEW_SYN_RECV, "10.0.0.2:9090", "10.0.0.1:5000", 0));
        t.add(&flood);
        // A later, emptier sample does not lower the peak.
        t.add(&[sock(TCP_LISTEN, "0.0.0.0:8080", "0.0.0.0:0", 9)]);
        let got = t.finish(&BTreeMap::new());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].half_open_peak, got[0].half_open_sources),
            (Some(40), Some(40))
        );
        // One client's burst: many half-open, one source.
        let mut t = ListenTrack::new(None);
        let mut burst = vec![sock(TCP_LISTEN, "10.0.0.2:8080", "0.0.0.0:0", 9)];
        for k in 0..30 {
            burst.push(sock(
                TCP_NEW_SYN_RECV,
                "10.0.0.2:8080",
                &format!("10.0.0.1:{}", 40_000 + k),
                0,
            ));
        }
        // Not this listener's address.
        burst.push(sock(TCP_NEW_SYN_RECV, "10.0.0.3:8080", "10.0.0.9:1", 0));
        t.add(&burst);
        let got = t.finish(&BTreeMap::new());
        assert_eq!(
            (got[0].half_open_peak, got[0].half_open_sources),
            (Some(30), Some(1))
        );
    }
}
