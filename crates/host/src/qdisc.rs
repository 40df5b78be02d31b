//! Qdisc statistics of the reading thread's namespace through rtnetlink (`RTM_GETQDISC`
//! dump; the socket and header through `lagtrace_sockets::netlink`), built by hand: a 16-byte `nlmsghdr`, a 20-byte `tcmsg`, then attributes —
//! `TCA_KIND` and the nested `TCA_STATS2` (`TCA_STATS_BASIC`: bytes, packets;
//! `TCA_STATS_QUEUE`: qlen, backlog, drops, requeues, overlimits). `tc -s qdisc` reads
//! the same attributes.

use std::collections::BTreeMap;
use std::io;

use lagtrace_model::host::QdiscDelta;
use lagtrace_sockets::netlink::{self, NLMSG_HDRLEN};

const RTM_NEWQDISC: u16 = 36;
const RTM_GETQDISC: u16 = 38;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCMSG_LEN: usize = 20;
const TCA_KIND: u16 = 1;
const TCA_STATS2: u16 = 7;
const TCA_STATS_BASIC: u16 = 1;
const TCA_STATS_QUEUE: u16 = 3;
const TC_H_ROOT: u32 = 0xFFFF_FFFF;
const TC_H_INGRESS: u32 = 0xFFFF_FFF1;

/// One qdisc's counters as the kernel reports them (totals since it was created).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QdiscStats {
    /// Device index.
    pub ifindex: i32,
    /// Handle.
    pub handle: u32,
    /// Parent handle.
    pub parent: u32,
    /// Kind (`tbf`, ...).
    pub kind: String,
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Queue length.
    pub qlen: u32,
    /// Bytes queued.
    pub backlog: u32,
    /// Drops.
    pub drops: u32,
    /// Requeues.
    pub requeues: u32,
    /// Overlimits.
    pub overlimits: u32,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Netlink attributes of `b`: (type without flag bits, payload).
fn attrs(b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut v = Vec::new();
    let mut off = 0;
    while let (Some(len), Some(ty)) = (u16_at(b, off), u16_at(b, off + 2)) {
        let len = len as usize;
        if len < 4 || off + len > b.len() {
            break;
        }
        v.push((ty & 0x3fff, &b[off + 4..off + len]));
        off += (len + 3) & !3;
    }
    v
}

/// Parses the payload of one `RTM_NEWQDISC` message (tcmsg + attributes).
pub fn parse_qdisc(b: &[u8]) -> Option<QdiscStats> {
    let mut q = QdiscStats {
        ifindex: u32_at(b, 4)? as i32,
        handle: u32_at(b, 8)?,
        parent: u32_at(b, 12)?,
        ..QdiscStats::default()
    };
    for (ty, p) in attrs(b.get(TCMSG_LEN..)?) {
        match ty {
            TCA_KIND => {
                q.kind = String::from_utf8_lossy(p.split(|&c| c == 0).next().unwrap_or(&[]))
                    .into_owned();
            }
            TCA_STATS2 => {
                for (ty, s) in attrs(p) {
                    match ty {
                        TCA_STATS_BASIC => {
                            q.bytes = u64_at(s, 0).unwrap_or(0);
                            q.packets = u32_at(s, 8).unwrap_or(0).into();
                        }
                        TCA_STATS_QUEUE => {
                            q.qlen = u32_at(s, 0).unwrap_or(0);
                            q.backlog = u32_at(s, 4).unwrap_or(0);
                            q.drops = u32_at(s, 8).unwrap_or(0);
                            q.requeues = u32_at(s, 12).unwrap_or(0);
                            q.overlimits = u32_at(s, 16).unwrap_or(0);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(q)
}

/// Every qdisc of the calling thread's namespace.
pub fn dump() -> io::Result<Vec<QdiscStats>> {
    let mut out = Vec::new();
    // struct tcmsg, zeroed: AF_UNSPEC, every device.
    let req = netlink::dump_request(RTM_GETQDISC, 1, &[0u8; TCMSG_LEN]);
    netlink::dump(libc::NETLINK_ROUTE, &req, |b| parse_batch(b, &mut out))?;
    Ok(out)
}

/// Parses one datagram of the dump into `out`; whether the dump is over.
pub fn parse_batch(buf: &[u8], out: &mut Vec<QdiscStats>) -> io::Result<bool> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32_at(buf, off).unwrap_or(0) as usize;
        let ty = u16_at(buf, off + 4).unwrap_or(0);
        if len < NLMSG_HDRLEN || len > buf.len() - off {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "rtnetlink: truncated message",
            ));
        }
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = u32_at(buf, off + NLMSG_HDRLEN).unwrap_or(0) as i32;
                if code == 0 {
                    return Ok(true);
                }
                return Err(io::Error::from_raw_os_error(code.unsigned_abs() as i32));
            }
            RTM_NEWQDISC => out.extend(parse_qdisc(&buf[off + NLMSG_HDRLEN..off + len])),
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(false)
}

/// A handle as `tc` prints it: `8001:`, `1:1`, `root`, `ingress`.
pub fn handle_text(h: u32) -> String {
    match h {
        TC_H_ROOT => "root".into(),
        TC_H_INGRESS => "ingress".into(),
        _ if h & 0xffff == 0 => format!("{:x}:", h >> 16),
        _ => format!("{:x}:{:x}", h >> 16, h & 0xffff),
    }
}

/// The device name of `ifindex` in the calling thread's namespace.
pub fn dev_name(ifindex: i32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex as u32, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("if{ifindex}");
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

type Key = (i32, u32, u32);

/// Readings keyed by (device, handle, parent).
pub fn keyed(v: Vec<QdiscStats>) -> BTreeMap<Key, QdiscStats> {
    v.into_iter()
        .map(|q| ((q.ifindex, q.handle, q.parent), q))
        .collect()
}

/// The window's counts per qdisc; `names` maps device indexes to names. A qdisc created
/// during the window counts from zero.
pub fn deltas(
    before: &BTreeMap<Key, QdiscStats>,
    after: &BTreeMap<Key, QdiscStats>,
    names: &BTreeMap<i32, String>,
) -> Vec<QdiscDelta> {
    let zero = QdiscStats::default();
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).unwrap_or(&zero);
            QdiscDelta {
                dev: names
                    .get(&a.ifindex)
                    .cloned()
                    .unwrap_or_else(|| format!("if{}", a.ifindex)),
                kind: a.kind.clone(),
                handle: handle_text(a.handle),
                parent: handle_text(a.parent),
                packets: a.packets.saturating_sub(b.packets),
                bytes: a.bytes.saturating_sub(b.bytes),
                drops: a.drops.saturating_sub(b.drops).into(),
                overlimits: a.overlimits.saturating_sub(b.overlimits).into(),
                requeues: a.requeues.saturating_sub(b.requeues).into(),
                drops_total: a.drops.into(),
                qlen: a.qlen,
                backlog_bytes: a.backlog,
                backlog_sampled: None,
            }
        })
        .collect()
}

/// Each qdisc's backlog (bytes) at every sample of a window, keyed like [`keyed`].
#[derive(Debug, Default)]
pub struct BacklogTrack {
    seen: BTreeMap<Key, Vec<u32>>,
}

impl BacklogTrack {
    /// Records one dump's backlogs.
    pub fn sample(&mut self, v: &[QdiscStats]) {
        for q in v {
            self.seen
                .entry((q.ifindex, q.handle, q.parent))
                .or_default()
                .push(q.backlog);
        }
    }

    /// Sets `backlog_sampled` on the deltas (in [`deltas`]' order, from the same `after`).
    pub fn finish(mut self, after: &BTreeMap<Key, QdiscStats>, out: &mut [QdiscDelta]) {
        for (k, d) in after.keys().zip(out.iter_mut()) {
            if let Some(v) = self.seen.get_mut(k).filter(|v| !v.is_empty()) {
                v.sort_unstable();
                d.backlog_sampled = Some(lagtrace_model::host::BacklogSamples {
                    samples: u32::try_from(v.len()).unwrap_or(u32::MAX),
                    p50_bytes: v[v.len() / 2],
                    max_bytes: v[v.len() - 1],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_samples_give_each_qdisc_its_median_and_max() {
        let q = |handle: u32, backlog: u32| QdiscStats {
            ifindex: 2,
            handle,
            parent: TC_H_ROOT,
            backlog,
            ..QdiscStats::default()
        };
        let mut t = BacklogTrack::default();
        for b in [9000, 100, 8000, 7000, 60_000] {
            t.sample(&[q(0x10000, b), q(0x20000, 0)]);
        }
        let after = keyed(vec![q(0x10000, 5), q(0x20000, 0), q(0x30000, 1)]);
        let mut d = deltas(&BTreeMap::new(), &after, &BTreeMap::new());
        t.finish(&after, &mut d);
        let s: Vec<_> = d.iter().map(|d| d.backlog_sampled).collect();
        let m = |samples, p50_bytes, max_bytes| {
            Some(lagtrace_model::host::BacklogSamples {
                samples,
                p50_bytes,
                max_bytes,
            })
        };
        // The third qdisc appeared after the last sample: none.
        assert_eq!(s, [m(5, 8000, 60_000), m(5, 0, 0), None]);
    }

    #[test]
    fn prints_handles_like_tc() {
        assert_eq!(handle_text(0x8001_0000), "8001:");
        assert_eq!(handle_text(0x0001_0001), "1:1");
        assert_eq!(handle_text(TC_H_ROOT), "root");
        assert_eq!(handle_text(0), "0:");
    }

    #[test]
    fn parses_kind_and_nested_stats() {
        let mut m = vec![0u8; TCMSG_LEN];
        m[4..8].copy_from_slice(&3i32.to_ne_bytes());
        m[12..16].copy_from_slice(&TC_H_ROOT.to_ne_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&TCA_KIND.to_ne_bytes());
        m.extend_from_slice(b"tbf\0");
        let mut basic = vec![];
        basic.extend_from_slice(&5000u64.to_ne_bytes());
        basic.extend_from_slice(&7u32.to_ne_bytes());
        basic.extend_from_slice(&[0; 4]);
        let mut queue = vec![];
        for v in [1u32, 100, 9, 0, 11] {
            queue.extend_from_slice(&v.to_ne_bytes());
        }
        let inner_len = 4 + basic.len() + 4 + queue.len();
        m.extend_from_slice(&((4 + inner_len) as u16).to_ne_bytes());
        m.extend_from_slice(&(TCA_STATS2 | 0x8000).to_ne_bytes());
        m.extend_from_slice(&((4 + basic.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&TCA_STATS_BASIC.to_ne_bytes());
        m.extend_from_slice(&basic);
        m.extend_from_slice(&((4 + queue.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&TCA_STATS_QUEUE.to_ne_bytes());
        m.extend_from_slice(&queue);
        let q = parse_qdisc(&m).unwrap();
        assert_eq!(
            (q.ifindex, q.kind.as_str(), q.parent),
            (3, "tbf", TC_H_ROOT)
        );
        assert_eq!(
            (q.bytes, q.packets, q.drops, q.overlimits, q.backlog),
            (5000, 7, 9, 11, 100)
        );
        assert!(parse_qdisc(&m[..10]).is_none());
    }

    #[test]
    fn dumps_this_namespace() {
        let all = dump().unwrap();
        assert!(all.iter().all(|q| !q.kind.is_empty()), "{all:?}");
    }
}
