//! Per-request records (opt-in, [`crate::LoadOptions::records`]): each thread keeps its
//! slowest records exactly and a uniform sample of the rest, in memory fixed at the start.
//! The sampling and its weights are documented on [`lagtrace_model::request`].

use std::os::fd::AsRawFd;

use lagtrace_model::RequestRecord;
use lagtrace_model::request::{SlowestAndSample, sample_key};

/// How many records each load thread keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOptions {
    /// The slowest records kept exactly, per thread.
    pub slow_cap: usize,
    /// The uniform sample of the other records, per thread.
    pub sample_cap: usize,
}

impl Default for RecordOptions {
    /// 4096 slow + 4096 sampled per thread (about 1.6 MB per thread at most): every request
    /// above p99 of runs up to 409 600 requests per thread is kept.
    fn default() -> Self {
        RecordOptions {
            slow_cap: 4096,
            sample_cap: 4096,
        }
    }
}

/// One thread's kept records. Both stores are allocated once, at their capacity: offering a
/// record never allocates.
pub(crate) struct Recorder {
    kept: SlowestAndSample<RequestRecord>,
    /// Every record made.
    pub seen: u64,
    /// Records made for requests or connects pending at the end.
    pub pending: u64,
}

impl Recorder {
    pub fn new(opts: RecordOptions, seed: u64) -> Self {
        Recorder {
            kept: SlowestAndSample::new(opts.slow_cap, opts.sample_cap, usize::MAX, seed),
            seen: 0,
            pending: 0,
        }
    }

    pub fn offer(&mut self, r: RequestRecord) {
        self.seen += 1;
        self.pending += u64::from(r.pending);
        // Keyed by what the capture's analyzer sees of the same request, so its sample of
        // transactions holds this sample's requests (`lagtrace_model::request::sample_key`).
        match r.local {
            Some(local) => {
                let key = sample_key(local, r.remote, r.index);
                self.kept.offer_keyed(r.wait_us, key, r);
            }
            None => self.kept.offer(r.wait_us, r),
        }
    }

    /// The kept records, flagged and weighted.
    pub fn finish(self) -> Vec<RequestRecord> {
        let k = self.kept.finish();
        let mut out = Vec::with_capacity(k.slow.len() + k.sample.len());
        out.extend(k.slow.into_iter().map(|mut r| {
            r.slow = true;
            r.weight = 1.0;
            r
        }));
        out.extend(k.sample.into_iter().map(|mut r| {
            r.slow = false;
            r.weight = k.weight;
            r
        }));
        out
    }
}

/// SYN retransmissions of a connect so far: `tcpi_total_retrans` of `TCP_INFO`. The kernel
/// counts every retransmitted segment there, the SYN included, and nothing else can have
/// been retransmitted before the handshake completes. `None` if the call fails.
pub(crate) fn syn_retransmits(sock: &impl AsRawFd) -> Option<u32> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the fd is a live socket borrowed for the call; `info` is a writable buffer of
    // `len` bytes (zeroed, so any prefix the kernel leaves unwritten is still initialised),
    // and `len` is a valid in/out length pointer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // tcpi_total_retrans ends at byte 104 of the struct (Linux ≥ 2.6.x always gives more).
    if rc != 0 || (len as usize) < 104 {
        return None;
    }
    // SAFETY: zero-initialised memory is a valid `tcp_info` (plain integers), and the kernel
    // wrote at least the fields read here.
    let info = unsafe { info.assume_init() };
    Some(info.tcpi_total_retrans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(wait_us: u64) -> RequestRecord {
        RequestRecord {
            conn: 0,
            local: None,
            remote: "127.0.0.1:80".parse().unwrap(),
            index: 0,
            start_us: 0,
            wait_us,
            connect_start_us: 0,
            connect_end_us: None,
            syn_retransmits: None,
            intended_us: None,
            sent_first_us: None,
            sent_last_us: None,
            first_byte_us: None,
            last_byte_us: None,
            bytes: 0,
            status: None,
            error: None,
            pending: false,
            slow: false,
            weight: 0.0,
        }
    }

    #[test]
    fn keeps_exactly_the_slowest_and_a_weighted_sample_of_the_rest() {
        let mut r = Recorder::new(
            RecordOptions {
                slow_cap: 10,
                sample_cap: 50,
            },
            7,
        );
        // 10 000 waits, a permutation of 1..=10000 (so the slowest ten are 9991..=10000).
        for k in 0..10_000u64 {
            r.offer(rec((k * 7919) % 10_000 + 1));
        }
        assert_eq!(r.seen, 10_000);
        let out = r.finish();
        assert_eq!(out.len(), 60);
        let mut slow: Vec<u64> = out.iter().filter(|x| x.slow).map(|x| x.wait_us).collect();
        slow.sort_unstable();
        assert_eq!(slow, (9991..=10_000).collect::<Vec<_>>());
        let sampled: Vec<&RequestRecord> = out.iter().filter(|x| !x.slow).collect();
        assert_eq!(sampled.len(), 50);
        assert!(sampled.iter().all(|x| x.wait_us <= 9990));
        let total: f64 = out.iter().map(|x| x.weight).sum();
        assert!((total - 10_000.0).abs() < 1e-6, "{total}");
        // A uniform sample of 1..=9990: its mean is near 4995 (σ of the mean ≈ 410).
        let mean = sampled.iter().map(|x| x.wait_us as f64).sum::<f64>() / 50.0;
        assert!((3000.0..7000.0).contains(&mean), "{mean}");
    }

    #[test]
    fn below_the_caps_everything_is_kept_with_weight_one() {
        let mut r = Recorder::new(RecordOptions::default(), 1);
        for k in 0..100 {
            r.offer(rec(k));
        }
        let out = r.finish();
        assert_eq!(out.len(), 100);
        assert!(out.iter().all(|x| x.weight == 1.0));
    }

    #[test]
    fn a_zero_sample_cap_keeps_only_the_slowest() {
        let mut r = Recorder::new(
            RecordOptions {
                slow_cap: 3,
                sample_cap: 0,
            },
            1,
        );
        for k in 0..100 {
            r.offer(rec(k));
        }
        let mut w: Vec<u64> = r.finish().iter().map(|x| x.wait_us).collect();
        w.sort_unstable();
        assert_eq!(w, vec![97, 98, 99]);
    }
}
