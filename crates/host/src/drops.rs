//! Drops by reason from the `skb:kfree_skb` tracepoint through `perf_event_open(2)`: one
//! sampling event per online CPU (every hit a sample with the raw tracepoint record), read
//! from each CPU's ring buffer. The record's layout and the reason names come from the
//! tracepoint's own `format` file (tracefs), so they follow the running kernel.
//!
//! The raw record carries skbaddr, location, protocol and reason but no namespace or
//! device: these counts are machine-wide. [`DropCounter`] prefers the per-namespace BPF
//! counter ([`crate::bpf`]) and falls back to them, saying why.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use lagtrace_model::host::{DeviceDrops, DropReasonCount, DropSample, DropsByReason};

use crate::bpf::{BpfError, NsCounts, NsDrops, Tracepoint};

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_SAMPLE_RAW: u64 = 1 << 10;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
const RING_PAGES: usize = 64;

/// The tracepoint's id, the reason field's place in the raw record, and the reason names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    /// Tracepoint id (perf's `config`).
    pub id: u64,
    /// Byte offset of `reason` in the raw record.
    pub reason_offset: usize,
    /// Byte offset of `skbaddr` in the raw record (none if the format has no such field).
    pub skbaddr_offset: Option<usize>,
    /// Size of `reason` (4).
    pub reason_size: usize,
    /// Reason number → name (`NETFILTER_DROP`), from the print format's `__print_symbolic`.
    pub names: BTreeMap<u32, String>,
}

/// Parses the `format` file of `skb:kfree_skb`.
pub fn parse_format(text: &str) -> Option<Format> {
    let tp = lagtrace_bpf::tracefs::Format::parse(text)?;
    let id = tp.id;
    let (reason_offset, reason_size) = tp.field("reason")?;
    let skbaddr_offset = tp.field("skbaddr").map(|(off, _)| off);
    let fmt = text.lines().find(|l| l.starts_with("print fmt:"))?;
    let mut names = BTreeMap::new();
    let sym = &fmt[fmt.find("__print_symbolic(")?..];
    for part in sym.split('{').skip(1) {
        let Some((n, rest)) = part.split_once(',') else {
            continue;
        };
        let name = rest.split('"').nth(1);
        if let (Ok(n), Some(name)) = (n.trim().parse::<u32>(), name) {
            names.insert(n, name.to_string());
        }
    }
    Some(Format {
        id,
        reason_offset,
        reason_size,
        skbaddr_offset,
        names,
    })
}

/// Finds the tracepoint's format file, mounting tracefs at /sys/kernel/tracing when no
/// tracefs is mounted (needs CAP_SYS_ADMIN).
pub fn find_format() -> io::Result<PathBuf> {
    lagtrace_bpf::tracefs::event_dir("skb", "kfree_skb").map(|d| d.join("format"))
}

struct Ring {
    fd: i32,
    base: *mut u8,
    len: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping and closing our own descriptor.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

/// Counting drops by reason while it lives.
pub struct DropTracer {
    format: Format,
    rings: Vec<Ring>,
    counts: BTreeMap<u32, u64>,
    lost: u64,
}

// SAFETY: the rings are plain memory mappings owned by this value; nothing else aliases them.
unsafe impl Send for DropTracer {}

fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = Vec::new();
    for part in text.trim().split(',') {
        let mut r = part.split('-').filter_map(|x| x.parse::<i32>().ok());
        match (r.next(), r.next()) {
            (Some(a), Some(b)) => v.extend(a..=b),
            (Some(a), None) => v.push(a),
            _ => {}
        }
    }
    v
}

fn open_cpu(id: u64, cpu: i32) -> io::Result<Ring> {
    // struct perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes): type, size, config,
    // sample_period, sample_type, read_format, flags (all 0: enabled, kernel included).
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&PERF_TYPE_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&64u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&id.to_ne_bytes());
    attr[16..24].copy_from_slice(&1u64.to_ne_bytes());
    attr[24..32].copy_from_slice(&PERF_SAMPLE_RAW.to_ne_bytes());
    // SAFETY: attr is a valid perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1 as libc::pid_t,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    } as i32;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = page * (1 + RING_PAGES);
    // SAFETY: mapping the event's ring buffer (one metadata page + 2^n data pages).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: closing the descriptor we just opened.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(Ring {
        fd,
        base: base.cast(),
        len,
    })
}

impl DropTracer {
    /// Opens the tracepoint on every online CPU.
    pub fn start() -> io::Result<DropTracer> {
        let path = find_format()?;
        let text = std::fs::read_to_string(&path)?;
        let format = parse_format(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: unexpected format", path.display()),
            )
        })?;
        let rings = online_cpus()
            .into_iter()
            .map(|cpu| open_cpu(format.id, cpu))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(DropTracer {
            format,
            rings,
            counts: BTreeMap::new(),
            lost: 0,
        })
    }

    /// Reads every ring up to the kernel's head.
    pub fn drain(&mut self) {
        for i in 0..self.rings.len() {
            let (base, len) = (self.rings[i].base, self.rings[i].len);
            // SAFETY: base maps `len` bytes: the metadata page then the data area.
            unsafe { self.drain_ring(base, len) };
        }
    }

    /// # Safety
    /// `base` must map a perf ring buffer of `len` bytes.
    unsafe fn drain_ring(&mut self, base: *mut u8, len: usize) {
        // struct perf_event_mmap_page: data_head @1024, data_tail @1032, data_offset @1040,
        // data_size @1048.
        // SAFETY: all offsets lie in the metadata page; the u64 fields are 8-aligned.
        let (head_p, tail_p, off, size) = unsafe {
            (
                &*(base.add(1024) as *const AtomicU64),
                &*(base.add(1032) as *const AtomicU64),
                (base.add(1040) as *const u64).read_volatile() as usize,
                (base.add(1048) as *const u64).read_volatile() as usize,
            )
        };
        let (off, size) = if size == 0 {
            (4096, len - 4096)
        } else {
            (off, size)
        };
        let head = head_p.load(Ordering::Acquire);
        let mut tail = tail_p.load(Ordering::Relaxed);
        // SAFETY: the data area is `size` bytes at `off` inside the mapping.
        let data = unsafe { std::slice::from_raw_parts(base.add(off), size) };
        let at = |pos: u64, n: usize| -> Cow<'_, [u8]> {
            let start = pos as usize % size;
            match data.get(start..start + n) {
                Some(s) => Cow::Borrowed(s),
                // The record wraps around the end of the ring.
                None => Cow::Owned((0..n).map(|k| data[(start + k) % size]).collect()),
            }
        };
        while tail < head {
            let h = at(tail, 8);
            let ty = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]);
            let rec_size = u16::from_ne_bytes([h[6], h[7]]) as usize;
            if rec_size < 8 {
                break;
            }
            match ty {
                PERF_RECORD_SAMPLE => {
                    let body = at(tail + 8, rec_size - 8);
                    self.count_sample(&body);
                }
                PERF_RECORD_LOST => {
                    let body = at(tail + 8, 16);
                    self.lost += u64::from_ne_bytes(body[8..16].try_into().unwrap_or([0; 8]));
                }
                _ => {}
            }
            tail += rec_size as u64;
        }
        tail_p.store(tail, Ordering::Release);
    }

    /// A sample with only PERF_SAMPLE_RAW: u32 size, then the tracepoint record.
    fn count_sample(&mut self, body: &[u8]) {
        let raw = body.get(4..).unwrap_or(&[]);
        let o = self.format.reason_offset;
        let reason = match self.format.reason_size {
            4 => raw
                .get(o..o + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
            2 => raw
                .get(o..o + 2)
                .map(|b| u16::from_ne_bytes([b[0], b[1]]).into()),
            _ => None,
        };
        if let Some(r) = reason {
            *self.counts.entry(r).or_default() += 1;
        }
    }

    /// Stops, drains, and returns the counts, most first.
    pub fn finish(mut self) -> DropsByReason {
        self.drain();
        DropsByReason {
            scope: "machine".into(),
            scope_reason: None,
            reasons: by_reason(&self.counts, &self.format.names),
            devices: Vec::new(),
            lost: self.lost,
            timeline: Vec::new(),
        }
    }
}

/// Counts by reason number → named counts, most first.
fn by_reason(counts: &BTreeMap<u32, u64>, names: &BTreeMap<u32, String>) -> Vec<DropReasonCount> {
    let mut reasons: Vec<DropReasonCount> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, &count)| DropReasonCount {
            reason: names
                .get(r)
                .cloned()
                .unwrap_or_else(|| format!("REASON_{r}")),
            count,
        })
        .collect();
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    reasons
}

/// The namespace's counts by reason and by device; `name` names an ifindex (in the
/// namespace: the caller runs there).
pub fn namespace_drops(
    c: &NsCounts,
    names: &BTreeMap<u32, String>,
    name: impl Fn(u32) -> Option<String>,
) -> DropsByReason {
    let mut total: BTreeMap<u32, u64> = BTreeMap::new();
    let mut per_dev: BTreeMap<u32, BTreeMap<u32, u64>> = BTreeMap::new();
    for (&(ifindex, reason), &n) in &c.counts {
        *total.entry(reason).or_default() += n;
        *per_dev
            .entry(ifindex)
            .or_default()
            .entry(reason)
            .or_default() += n;
    }
    let mut devices: Vec<DeviceDrops> = per_dev
        .iter()
        .map(|(&ifindex, reasons)| DeviceDrops {
            ifindex,
            device: if ifindex == 0 { None } else { name(ifindex) },
            count: reasons.values().sum(),
            reasons: by_reason(reasons, names),
        })
        .filter(|d| d.count > 0)
        .collect();
    devices.sort_by(|a, b| b.count.cmp(&a.count).then(a.ifindex.cmp(&b.ifindex)));
    DropsByReason {
        scope: "namespace".into(),
        scope_reason: None,
        reasons: by_reason(&total, names),
        devices,
        lost: c.missed,
        timeline: Vec::new(),
    }
}

/// Why no drop counter could run: `unavailable` (privilege) or an error.
#[derive(Debug)]
pub struct NoCounter {
    /// Missing privilege (else the kernel or the build refused).
    pub privilege: bool,
    /// What was tried and why it failed.
    pub why: String,
}

/// What counts the drops: the watched namespace's BPF program, or machine-wide (perf)
/// when that cannot run and the caller accepts it.
pub enum Counter {
    /// Per namespace and device.
    Namespace {
        /// The attached program.
        bpf: NsDrops,
        /// Reason number → name, from the tracepoint's format (empty if unreadable).
        names: BTreeMap<u32, String>,
    },
    /// Machine-wide, with why not per namespace.
    Machine(DropTracer, String),
}

/// The drop counter of a window, with the drops placed in time: each sampling tick's new
/// drops by reason ([`DropCounter::tick`]).
pub struct DropCounter {
    counter: Counter,
    /// The counts by reason number at the last tick, and when it was.
    last: (u64, BTreeMap<u32, u64>),
    timeline: Vec<DropSample>,
}

/// Most timeline samples kept (with drops: the ticks without are not kept): 100 ms ticks
/// for ~17 minutes of drops every tick.
const MAX_SAMPLES: usize = 10_000;

impl DropCounter {
    /// Starts counting the drops of the namespace with inode `netns` (the caller's); when
    /// the BPF counter cannot run, machine-wide if `machine`.
    pub fn start(netns: u64, machine: bool) -> Result<DropCounter, NoCounter> {
        // tracefs mounted (the program attaches by the tracepoint's id) and the names.
        let format = find_format()
            .and_then(std::fs::read_to_string)
            .ok()
            .and_then(|t| parse_format(&t));
        let inum = u32::try_from(netns).unwrap_or(0);
        let tp = format.as_ref().and_then(|f| {
            Some(Tracepoint {
                id: f.id,
                skbaddr: u32::try_from(f.skbaddr_offset?).ok()?,
                reason: u32::try_from(f.reason_offset)
                    .ok()
                    .filter(|_| f.reason_size == 4)?,
            })
        });
        let names = format.map(|f| f.names).unwrap_or_default();
        let started = match tp {
            Some(tp) => NsDrops::start(inum, &tp),
            None => Err(BpfError::Kernel(
                "no skb:kfree_skb format (tracefs) with skbaddr and a 4-byte reason".into(),
            )),
        };
        let (why, privilege) = match started {
            Ok(bpf) if inum != 0 => return Ok(DropCounter::new(Counter::Namespace { bpf, names })),
            Ok(_) => (
                "the watched namespace's inode is unknown".to_string(),
                false,
            ),
            Err(e) => (e.to_string(), matches!(e, BpfError::Privilege(_))),
        };
        if !machine {
            return Err(NoCounter { privilege, why });
        }
        match DropTracer::start() {
            Ok(t) => Ok(DropCounter::new(Counter::Machine(t, why))),
            Err(e) => Err(NoCounter {
                privilege: matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)),
                why: format!(
                    "{why}; machine-wide, the skb:kfree_skb tracepoint: {e}{}",
                    if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
                        " (needs CAP_PERFMON, and CAP_SYS_ADMIN to mount tracefs)"
                    } else {
                        ""
                    }
                ),
            }),
        }
    }

    fn new(counter: Counter) -> DropCounter {
        DropCounter {
            counter,
            last: (unix_us(), BTreeMap::new()),
            timeline: Vec::new(),
        }
    }

    /// A sampling tick: reads the perf rings (machine-wide) or the BPF map, and notes the
    /// drops since the last tick by reason, with when.
    pub fn tick(&mut self) {
        let now = unix_us();
        let counts = match &mut self.counter {
            Counter::Machine(t, _) => {
                t.drain();
                t.counts.clone()
            }
            Counter::Namespace { bpf, .. } => match bpf.read() {
                Ok(c) => {
                    let mut by: BTreeMap<u32, u64> = BTreeMap::new();
                    for (&(_, reason), &n) in &c.counts {
                        *by.entry(reason).or_default() += n;
                    }
                    by
                }
                Err(_) => return,
            },
        };
        let new: BTreeMap<u32, u64> = counts
            .iter()
            .map(|(&r, &n)| {
                (
                    r,
                    n.saturating_sub(self.last.1.get(&r).copied().unwrap_or(0)),
                )
            })
            .filter(|&(_, n)| n > 0)
            .collect();
        if !new.is_empty() && self.timeline.len() < MAX_SAMPLES {
            let names = match &self.counter {
                Counter::Machine(t, _) => &t.format.names,
                Counter::Namespace { names, .. } => names,
            };
            self.timeline.push(DropSample {
                start_unix_us: self.last.0,
                end_unix_us: now,
                reasons: by_reason(&new, names),
            });
        }
        self.last = (now, counts);
    }

    /// Stops and returns the counts; `Err` when the BPF map cannot be read.
    pub fn finish(mut self) -> Result<DropsByReason, String> {
        self.tick();
        let timeline = self.timeline;
        let mut d = match self.counter {
            Counter::Namespace { bpf, names } => {
                let c = bpf.read().map_err(|e| e.to_string())?;
                let name = |i: u32| {
                    let n = crate::qdisc::dev_name(i as i32);
                    (n != format!("if{i}")).then_some(n)
                };
                namespace_drops(&c, &names, name)
            }
            Counter::Machine(t, why) => {
                let mut d = t.finish();
                d.scope_reason = Some(why);
                d
            }
        };
        d.timeline = timeline;
        Ok(d)
    }
}

/// Now on `CLOCK_REALTIME`, µs since the Unix epoch (the clock of the load's records).
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "name: kfree_skb\nID: 2310\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:enum skb_drop_reason reason;\toffset:36;\tsize:4;\tsigned:0;\n\n\
print fmt: \"skbaddr=%p reason: %s\", REC->skbaddr, __print_symbolic(REC->reason, { 2, \"NOT_SPECIFIED\" }, { 12, \"NETFILTER_DROP\" })\n";

    #[test]
    fn reads_id_reason_field_and_names_from_the_format_file() {
        let f = parse_format(FORMAT).unwrap();
        assert_eq!((f.id, f.reason_offset, f.reason_size), (2310, 36, 4));
        assert_eq!(f.names[&12], "NETFILTER_DROP");
        assert_eq!(f.names.len(), 2);
        assert!(parse_format("name: x\n").is_none());
    }

    #[test]
    fn namespace_counts_group_by_reason_and_by_device() {
        let names = parse_format(FORMAT).unwrap().names;
        let c = NsCounts {
            counts: BTreeMap::from([((1, 12), 10), ((3, 12), 2), ((3, 2), 5), ((0, 99), 1)]),
            missed: 4,
        };
        let d = namespace_drops(&c, &names, |i| (i == 1).then(|| "lo".to_string()));
        assert_eq!((d.scope.as_str(), d.lost), ("namespace", 4));
        let r: Vec<(&str, u64)> = d
            .reasons
            .iter()
            .map(|c| (c.reason.as_str(), c.count))
            .collect();
        assert_eq!(
            r,
            [
                ("NETFILTER_DROP", 12),
                ("NOT_SPECIFIED", 5),
                ("REASON_99", 1)
            ]
        );
        let devs: Vec<(u32, Option<&str>, u64)> = d
            .devices
            .iter()
            .map(|x| (x.ifindex, x.device.as_deref(), x.count))
            .collect();
        assert_eq!(devs, [(1, Some("lo"), 10), (3, None, 7), (0, None, 1)]);
        assert_eq!(d.devices[1].reasons[0].reason, "NOT_SPECIFIED");
    }

    #[test]
    fn counts_a_sample_by_its_reason() {
        let mut t = DropTracer {
            format: parse_format(FORMAT).unwrap(),
            rings: Vec::new(),
            counts: BTreeMap::new(),
            lost: 0,
        };
        let mut body = 44u32.to_ne_bytes().to_vec();
        let mut raw = vec![0u8; 44];
        raw[36..40].copy_from_slice(&12u32.to_ne_bytes());
        body.extend(raw);
        t.count_sample(&body);
        t.count_sample(&body[..10]);
        let d = t.finish();
        assert_eq!(d.reasons.len(), 1);
        assert_eq!(
            (d.reasons[0].reason.as_str(), d.reasons[0].count),
            ("NETFILTER_DROP", 1)
        );
    }
}
