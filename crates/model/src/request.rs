//! Per-request records of a load run: what one request (or one connect attempt that never
//! became a request) waited for, with the timestamps a packet capture can be joined on.
//!
//! # Clock
//! Every `*_us` time is whole microseconds since the run's start on the monotonic clock
//! (`CLOCK_MONOTONIC`). [`RequestRecords::start_unix_us`] is the same instant on
//! `CLOCK_REALTIME` (µs since the Unix epoch), read right after the monotonic start: add it
//! to a `*_us` time to get the wall-clock time a pcap stamps its packets with (both clocks
//! tick at the same rate over a run of seconds; NTP slewing is below 0.05 %).
//!
//! # Which requests are kept (bounded memory)
//! Each load thread keeps
//! - the `slow_cap` slowest of its records by [`RequestRecord::wait_us`], exactly (a min-heap:
//!   a record leaves it only for a slower one). These are "slow": [`RequestRecord::slow`] is
//!   true and [`RequestRecord::weight`] is 1. Every record of a thread slower than its
//!   `1 − slow_cap / n` quantile is kept (n = records of that thread): with the default cap
//!   of 4096, every request above the thread's p99 in runs of up to 409 600 requests per
//!   thread, and above p99.9 up to 4 096 000.
//! - a uniform reservoir sample (Vitter's algorithm R) of `sample_cap` of all its other
//!   records, each offered once: either never slow enough for the heap, or pushed out of it.
//!   Each sampled record stands for `weight = others / kept` records of its thread
//!   (`others` = that thread's records not in its slow set), so a weighted count or
//!   percentile over all records estimates the whole run: `Σ weight` equals
//!   [`RequestRecords::seen`].
//!
//! Memory is therefore at most `threads × (slow_cap + sample_cap)` records (about 200 bytes
//! each, none allocated per request), whatever the run's length; below that bound nothing is dropped and every weight is 1.
//!
//! # Which events make a record
//! A completed response, a request that failed (read/write error, `--timeout`), a connect
//! that failed or timed out (it is a request that waited that long, not a missing one), and
//! at the run's end every request or connect still pending ([`RequestRecord::pending`]: the
//! wait is "at least" its age). A connection opened while no request was due (a `--rate`
//! connection waiting for its first send time, or a run whose `-n` budget is spent) makes no
//! record of its own while pending.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The per-request records of one load run and how they were sampled.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RequestRecords {
    /// The run's start (time 0 of every `*_us` time) on `CLOCK_REALTIME`, µs since the Unix
    /// epoch.
    pub start_unix_us: u64,
    /// Load threads; each kept its own slow set and sample.
    pub threads: u32,
    /// Per thread: the most slow records kept.
    pub slow_cap: u32,
    /// Per thread: the size of the uniform sample of the other records.
    pub sample_cap: u32,
    /// Records made in the run (kept or not): the sum of the kept records' weights.
    pub seen: u64,
    /// Of `seen`, the records of requests and connects still pending at the run's end (kept
    /// or not): `seen − pending` is the run's completed requests plus its failed ones.
    pub pending: u64,
    /// The kept records, ordered by `start_us` (then connection, then index).
    pub records: Vec<RequestRecord>,
}

/// One request, or one connect attempt that never carried a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RequestRecord {
    /// Connection id, unique within the run (counts connect attempts from 0 in the order the
    /// threads made them: thread `t`'s ids are `t + k × threads`).
    pub conn: u64,
    /// Local address and port of the connection (JSON `"ip:port"`), as the server and a
    /// capture see it; `None` when the socket never got one (it could not be opened).
    pub local: Option<SocketAddr>,
    /// Remote address and port (JSON `"ip:port"`).
    pub remote: SocketAddr,
    /// Index of the request on its connection: 0 is the first.
    pub index: u32,
    /// When the request's wait began: the intended send time under `--rate`, else the
    /// connect start for a connection's first request (and for a failed connect), else the
    /// first write.
    pub start_us: u64,
    /// Total wait: from `start_us` to the last response byte, the failure, or the run's end
    /// (then `pending` is set and the true wait is at least this).
    pub wait_us: u64,
    /// Connect start (the non-blocking `connect(2)`) of the connection.
    pub connect_start_us: u64,
    /// Connect end: the handshake completed (socket writable), or the connect failed or timed
    /// out (`error` says which). `None` while still pending at the run's end.
    pub connect_end_us: Option<u64>,
    /// SYN retransmissions the connect needed (`tcpi_total_retrans` of `TCP_INFO` read as the
    /// connect ends: it counts SYN retransmits until the handshake completes). `None` when
    /// `TCP_INFO` could not be read.
    pub syn_retransmits: Option<u32>,
    /// Intended send time under `--rate` (what the latency is measured from there).
    pub intended_us: Option<u64>,
    /// The first write of the request. `None` when it never started (a connect record).
    pub sent_first_us: Option<u64>,
    /// The write that finished the request. `None` when it never finished.
    pub sent_last_us: Option<u64>,
    /// The first response byte read.
    pub first_byte_us: Option<u64>,
    /// The last response byte read (the response complete).
    pub last_byte_us: Option<u64>,
    /// Response bytes read (head and body, after TLS).
    pub bytes: u64,
    /// HTTP status of a complete response.
    pub status: Option<u16>,
    /// Why the request did not complete; `None` for a response (whatever its status) and for
    /// a pending one.
    pub error: Option<RequestError>,
    /// Still pending when the run ended: `wait_us` is a lower bound ("≥ its age").
    pub pending: bool,
    /// Kept as one of its thread's slowest (weight 1), not as part of the sample.
    pub slow: bool,
    /// How many records of the run this one stands for (1 unless sampled; see the module
    /// docs).
    pub weight: f64,
}

/// Why a request did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RequestError {
    /// The connect was refused (RST to the SYN).
    ConnectRefused,
    /// No handshake before the connect timeout.
    ConnectTimeout,
    /// Any other connect failure (unreachable, reset, no socket or file descriptor left).
    Connect,
    /// Reading the response failed: reset, invalid response, closed mid-response.
    Read,
    /// Writing the request failed.
    Write,
    /// No complete response before the request timeout.
    Timeout,
}

impl RequestError {
    /// The JSON name (`connect-timeout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RequestError::ConnectRefused => "connect-refused",
            RequestError::ConnectTimeout => "connect-timeout",
            RequestError::Connect => "connect",
            RequestError::Read => "read",
            RequestError::Write => "write",
            RequestError::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The keeping described above, for any item with a wait: the `slow_cap` items with the
/// largest wait exactly (a min-heap) and a uniform sample of `sample_cap` of the others, each
/// offered to the sample once (never slow enough, or pushed out of the slow set). The sample
/// is the others with the smallest *sample keys* (bottom-k sampling): random keys
/// ([`SlowestAndSample::offer`]) make it a uniform random sample; keys that are a hash of
/// what identifies the item on both sides of a join ([`sample_key`],
/// [`SlowestAndSample::offer_keyed`]) make two keepers of the same traffic — the load
/// engine's records and a capture's transactions — sample the *same* requests, so every
/// sampled record finds its transaction. Used for the load engine's records and for a
/// capture's transactions.
pub struct SlowestAndSample<T> {
    slow_cap: usize,
    sample_cap: usize,
    /// The slowest, by wait; each with its sample key, for when it is pushed out.
    slow: std::collections::BinaryHeap<std::cmp::Reverse<ByKey<(u64, T)>>>,
    /// The sample: a max-heap by sample key, so the largest goes first.
    sample: std::collections::BinaryHeap<ByKey<T>>,
    /// Items offered to the sample.
    others: u64,
    rng: u64,
}

/// An item ordered by its key only.
struct ByKey<T>(u64, T);

impl<T> PartialEq for ByKey<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T> Eq for ByKey<T> {}
impl<T> PartialOrd for ByKey<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for ByKey<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// What was kept: the slow items, the sampled ones, and how many items each sampled one
/// stands for.
pub struct Kept<T> {
    /// The slowest items, in no particular order.
    pub slow: Vec<T>,
    /// The sampled others.
    pub sample: Vec<T>,
    /// `others / sample.len()` (1 with an empty sample).
    pub weight: f64,
}

/// splitmix64's finaliser: a 64-bit mix with full avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The sample key of a request as both ends of a join know it: the client's and the
/// server's endpoints (IPv4-mapped addresses as IPv4) and the request's index on its
/// connection. A fixed hash: the load engine and the capture's analyzer, keeping the same
/// traffic with [`SlowestAndSample::offer_keyed`], sample the same requests.
pub fn sample_key(client: std::net::SocketAddr, server: std::net::SocketAddr, index: u32) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325_u64;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    };
    for a in [client, server] {
        match a.ip().to_canonical() {
            std::net::IpAddr::V4(v) => eat(&v.octets()),
            std::net::IpAddr::V6(v) => eat(&v.octets()),
        }
        eat(&a.port().to_be_bytes());
    }
    eat(&index.to_be_bytes());
    mix64(h)
}

/// The sample keys ([`sample_key`]) of the requests a load kept, given to the analyzer of a
/// capture of the same run so that it keeps their transactions too: a request slow at the
/// client can be fast at the capture (its time spent in the client), and only the load knows
/// it was slow.
pub type WantedKeys = std::collections::HashSet<u64>;

impl<T> SlowestAndSample<T> {
    /// Empty, with room for at most `prealloc` items of each store allocated up front (then
    /// offering never allocates below that); `seed` picks the random sample keys of
    /// [`SlowestAndSample::offer`] (the same seed and items keep the same sample).
    pub fn new(slow_cap: usize, sample_cap: usize, prealloc: usize, seed: u64) -> Self {
        SlowestAndSample {
            slow_cap,
            sample_cap,
            slow: std::collections::BinaryHeap::with_capacity(slow_cap.min(prealloc)),
            sample: std::collections::BinaryHeap::with_capacity(sample_cap.min(prealloc)),
            others: 0,
            // splitmix64 must not start at a fixed point of the sequence; any seed works.
            rng: seed ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// splitmix64: uniform enough for sample keys, no dependency.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.rng)
    }

    /// Offers `item` whose wait is `wait`, with a random sample key.
    pub fn offer(&mut self, wait: u64, item: T) {
        let key = self.next_u64();
        self.offer_keyed(wait, key, item);
    }

    /// Offers `item` whose wait is `wait`; should it go to the sample, it is kept when its
    /// `sample_key` is among the `sample_cap` smallest offered there.
    pub fn offer_keyed(&mut self, wait: u64, sample_key: u64, item: T) {
        use std::cmp::Reverse;
        if self.slow.len() < self.slow_cap {
            self.slow.push(Reverse(ByKey(wait, (sample_key, item))));
            return;
        }
        match self.slow.peek() {
            Some(Reverse(fastest)) if wait > fastest.0 => {
                let out = self.slow.pop().map(|Reverse(b)| b.1);
                self.slow.push(Reverse(ByKey(wait, (sample_key, item))));
                if let Some((k, out)) = out {
                    self.sample(k, out);
                }
            }
            _ => self.sample(sample_key, item),
        }
    }

    /// Bottom-k: keeps the `sample_cap` items with the smallest keys offered here.
    fn sample(&mut self, key: u64, item: T) {
        self.others += 1;
        if self.sample.len() < self.sample_cap {
            self.sample.push(ByKey(key, item));
        } else if self.sample.peek().is_some_and(|largest| key < largest.0) {
            self.sample.pop();
            self.sample.push(ByKey(key, item));
        }
    }

    /// The kept items.
    pub fn finish(self) -> Kept<T> {
        let weight = if self.sample.is_empty() {
            1.0
        } else {
            self.others as f64 / self.sample.len() as f64
        };
        Kept {
            slow: self
                .slow
                .into_iter()
                .map(|std::cmp::Reverse(b)| b.1.1)
                .collect(),
            sample: self.sample.into_iter().map(|b| b.1).collect(),
            weight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_serialize_as_kebab_case_and_records_round_trip() {
        assert_eq!(
            serde_json::to_string(&RequestError::ConnectTimeout).unwrap(),
            "\"connect-timeout\""
        );
        use RequestError::*;
        for e in [
            ConnectRefused,
            ConnectTimeout,
            Connect,
            Read,
            Write,
            Timeout,
        ] {
            assert_eq!(serde_json::to_string(&e).unwrap(), format!("\"{e}\""));
        }
        let r = RequestRecord {
            conn: 3,
            local: Some("10.0.0.1:40000".parse().unwrap()),
            remote: "10.0.0.2:80".parse().unwrap(),
            index: 0,
            start_us: 10,
            wait_us: 1_000_100,
            connect_start_us: 10,
            connect_end_us: Some(1_000_050),
            syn_retransmits: Some(1),
            intended_us: None,
            sent_first_us: Some(1_000_060),
            sent_last_us: Some(1_000_060),
            first_byte_us: Some(1_000_100),
            last_byte_us: Some(1_000_110),
            bytes: 80,
            status: Some(200),
            error: None,
            pending: false,
            slow: true,
            weight: 1.0,
        };
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RequestRecord>(&j).unwrap(), r);
    }

    /// Two keepers of the same requests — one slow set by the client's waits, one by the
    /// capture's, which disagree — sample the same requests when keyed by [`sample_key`]:
    /// the denser sample holds the sparser one, so every sampled record finds its
    /// transaction. Random keys (the control) would not.
    #[test]
    fn keyed_samples_of_the_same_requests_nest_whatever_each_side_calls_slow() {
        let client: std::net::SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let server: std::net::SocketAddr = "10.0.0.2:80".parse().unwrap();
        let mut load = SlowestAndSample::new(50, 100, usize::MAX, 1);
        let mut capture = SlowestAndSample::new(200, 400, usize::MAX, 2);
        let mut random = SlowestAndSample::new(200, 400, usize::MAX, 3);
        for i in 0..50_000u32 {
            let c = std::net::SocketAddr::new(client.ip(), 40_000 + (i % 64) as u16);
            let key = sample_key(c, server, i / 64);
            // The client's wait and the capture's are unrelated orders.
            let at_client = u64::from(i.wrapping_mul(2_654_435_761) % 100_000);
            let at_capture = u64::from(i.wrapping_mul(40_503) % 100_000);
            load.offer_keyed(at_client, key, i);
            capture.offer_keyed(at_capture, key, i);
            random.offer(at_capture, i);
        }
        let load = load.finish();
        let capture = capture.finish();
        let kept: std::collections::HashSet<u32> = capture
            .slow
            .iter()
            .chain(&capture.sample)
            .copied()
            .collect();
        assert_eq!(load.sample.len(), 100);
        assert!(load.sample.iter().all(|i| kept.contains(i)));
        let random = random.finish();
        let kept: std::collections::HashSet<u32> =
            random.slow.iter().chain(&random.sample).copied().collect();
        assert!(load.sample.iter().filter(|i| kept.contains(i)).count() < 20);
        // The key is the request's, the address family's spelling aside.
        let mapped: std::net::SocketAddr = "[::ffff:10.0.0.1]:40000".parse().unwrap();
        assert_eq!(sample_key(mapped, server, 3), sample_key(client, server, 3));
        assert_ne!(sample_key(client, server, 3), sample_key(client, server, 4));
    }

    /// The slowest by wait, the rest to the sample; bottom-k by random keys is uniform.
    #[test]
    fn the_slowest_are_kept_and_random_keys_sample_uniformly() {
        let mut k = SlowestAndSample::new(2, 1000, usize::MAX, 9);
        k.offer_keyed(10, 1, 0u32);
        k.offer_keyed(5, 2, 1);
        k.offer_keyed(4, 3, 2);
        k.offer_keyed(11, 4, 3);
        let kept = k.finish();
        let mut slow = kept.slow.clone();
        slow.sort_unstable();
        assert_eq!(slow, vec![0, 3]);
        let mut sample = kept.sample.clone();
        sample.sort_unstable();
        assert_eq!(sample, vec![1, 2]);
        let mut u = SlowestAndSample::new(0, 1000, usize::MAX, 9);
        for i in 0..100_000u64 {
            u.offer(i, i);
        }
        let u = u.finish();
        let mean = u.sample.iter().sum::<u64>() as f64 / u.sample.len() as f64;
        // σ of the mean of 1000 of U(0, 100 000) ≈ 913.
        assert!((45_000.0..55_000.0).contains(&mean), "{mean}");
        assert!((u.weight - 100.0).abs() < 1e-9);
    }
}
