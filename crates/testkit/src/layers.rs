//! Constructed evidence for the verdict rules and the renderers: a target, synthetic
//! latency distributions, findings, and a healthy lab's four layers that a test then bends
//! into the case it needs.

use lagtrace_model::diagnosis::evidence::*;

/// The lab's latency server as a target.
pub fn target() -> Target {
    Target {
        url: "http://10.77.0.2:8080/".into(),
        host: "10.77.0.2".into(),
        addr: "10.77.0.2".into(),
        port: 8080,
    }
}

/// How synthetic application runs are shaped: the minimum as a fraction of the median, the
/// run's length, and whether the run carries a percentile distribution (the HTML chart).
#[derive(Clone, Copy, Debug)]
pub struct Synth {
    /// `min = p50 / min_div`.
    pub min_div: u64,
    /// Seconds each run lasts (`requests = rps × secs`).
    pub secs: u64,
    /// Whether [`Synth::run`] fills `distribution`.
    pub distribution: bool,
}

impl Synth {
    /// Five-second runs, min = p50/2, no distribution: what the rules look at.
    pub const RULES: Synth = Synth {
        min_div: 2,
        secs: 5,
        distribution: false,
    };
    /// Four-second runs, min = p50/3, with a distribution to chart: what the reports draw.
    pub const REPORT: Synth = Synth {
        min_div: 3,
        secs: 4,
        distribution: true,
    };

    /// A latency summary of `count` samples around `p50` with a tail at `p99`.
    pub fn pct(&self, count: u64, p50: u64, p99: u64) -> Percentiles {
        Percentiles {
            count,
            min_us: p50 / self.min_div,
            mean_us: p50,
            p50_us: p50,
            p90_us: (p50 + p99) / 2,
            p99_us: p99,
            p999_us: p99 + p99 / 10,
            max_us: p99 * 2,
        }
    }

    /// The percentile points of a distribution shaped like [`Synth::pct`].
    pub fn dist(&self, p50: u64, p99: u64) -> Vec<PercentilePoint> {
        [
            (0.0, p50 / self.min_div),
            (25.0, p50 * 9 / 10),
            (50.0, p50),
            (75.0, p50 * 11 / 10),
            (90.0, (p50 + p99) / 2),
            (99.0, p99),
            (99.9, p99 * 11 / 10),
            (100.0, p99 * 2),
        ]
        .into_iter()
        .map(|(p, v)| PercentilePoint {
            percentile: p,
            latency_us: v,
        })
        .collect()
    }

    /// One application run at concurrency `c`.
    pub fn run(&self, c: u32, p50: u64, p99: u64, rps: f64) -> AppRun {
        let requests = (rps * self.secs as f64) as u64;
        AppRun {
            concurrency: c,
            requests,
            duration_us: self.secs * 1_000_000,
            requests_per_sec: rps,
            latency: self.pct(requests, p50, p99),
            distribution: if self.distribution {
                self.dist(p50, p99)
            } else {
                vec![]
            },
            errors: Errors::default(),
            first_request: None,
            bytes: 0,
            later_requests: None,
            waits: None,
            connects: None,
            records: None,
            client_cpu: None,
            passive: None,
        }
    }

    /// A healthy lab: veth RTT, fast server, nothing in the packets, NODELAY on.
    pub fn healthy_layers(&self) -> Layers {
        Layers {
            path: Layer::ran(PathEvidence {
                method: "tcp-syn".into(),
                idle: Some(rtt(60)),
                under_load: Some(rtt(140)),
                hops: vec![],
                reached: true,
                port_open: true,
                notes: vec![],
                route: None,
            }),
            app: Layer::ran(AppEvidence {
                c1: Some(self.run(1, 110, 300, 8000.0)),
                cn: Some(self.run(32, 1_400, 6_000, 22_000.0)),
            }),
            packets: Layer::ran(PacketEvidence {
                capture_point: "veth0".into(),
                packets: 400_000,
                dropped: 0,
                streams: 32,
                transactions: 100_000,
                handshake_rtt: Some(self.pct(32, 70, 200)),
                server_time: Some(self.pct(100_000, 90, 900)),
                exchange_time: None,
                findings: vec![],
                example_flow: None,
                joins: Vec::new(),
                black_hole: None,
                server_syn_synack: None,
                syn_acks_lost: None,
                inbound_lost: None,
                limits: Vec::new(),
            }),
            sockets: Layer::ran(SocketEvidence {
                client: ClientSide::default(),
                server: Some(ServerProcess {
                    pid: 4242,
                    comm: "nginx".into(),
                    netns: "lab".into(),
                }),
                established: 32,
                nodelay: options(32, 0),
                cork: options(0, 32),
                config: vec![],
                notes: vec![],
            }),
            host: Layer::skipped("not measured in this fixture"),
            hops: Vec::new(),
        }
    }
}

/// Five SYN RTT samples around `p50` µs.
pub fn rtt(p50: u64) -> RttStats {
    RttStats::from_samples(5, 0, &[p50, p50, p50 + 10, p50 - 5, p50])
}

/// A socket option seen `on` and `off` times, never unknown.
pub fn options(on: u32, off: u32) -> OptionCount {
    OptionCount {
        on,
        off,
        unknown: 0,
    }
}

/// An nginx directive at `file:line`, set explicitly.
pub fn directive(name: &str, value: &str, file: &str, line: u32) -> ConfigDirective {
    ConfigDirective {
        name: name.into(),
        value: value.into(),
        file: file.into(),
        line,
        default: false,
    }
}

/// A finding of `kind` on `tx` of `total` transactions, each adding about `median` µs,
/// with one example (stream 2, frames 41/44/45).
pub fn finding(kind: &str, tx: u64, total: u64, median: u64) -> FindingSummary {
    FindingSummary {
        kind: FindingKind::from_name(kind).expect("a known finding kind"),
        count: tx,
        transactions: tx,
        share: tx as f64 / total as f64,
        median_added_us: median,
        p99_added_us: median + median / 20,
        examples: vec![FindingExample {
            stream: 2,
            frames: vec![41, 44, 45],
            time_us: 47_146,
            added_us: median,
            note: "held until the ACK".into(),
        }],
    }
}
