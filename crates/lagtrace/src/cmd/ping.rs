//! `lagtrace ping`.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use lagtrace_probe::{PingMode, PingOptions, PingReport, Sample, SampleKind};

/// TCP SYN RTT to HOST[:PORT], like `hping3 -S`, with µs precision.
#[derive(Debug, clap::Args)]
// -V is the peer's verbose flag here (the version is `lagtrace --version`).
#[command(disable_version_flag = true)]
#[command(after_help = "\
Modes: the default sends TCP SYNs from a raw socket (CAP_NET_RAW) from a local port held by a
bound, unconnected socket, so the kernel answers the SYN-ACK with RST and no half-open
connection stays on the target; a RST from a closed port is a valid RTT sample. Without
CAP_NET_RAW it falls back to --connect and says so. --connect times connect() (no privilege;
it completes real handshakes: the server's application sees connections, each closed with
RST so no TIME_WAIT piles up). --udp sends to a closed port and times the ICMP port
unreachable; --icmp sends echo requests. All probes of a run use one flow (same ports).

Timing: the send time is the kernel's software TX timestamp (SO_TIMESTAMPING) when the device
takes the packet during the send, else CLOCK_MONOTONIC right before sendto(); the receive time
is the kernel's software RX timestamp (SO_TIMESTAMPNS). Kernel timestamps are CLOCK_REALTIME
and are converted to CLOCK_MONOTONIC with one measured offset, so clock domains never mix.
--json states the source as `timestamp_source`.

Exit status: 0 at least one reply; 1 no reply (100% loss); 2 could not run (bad input, no
route, missing privilege).

Coming from hping3: -S (SYN, the default), -p, -c, -i (u10000 = 10000 µs), -1 (ICMP), -2 (UDP),
-t (TTL) and --fast mean the same here, -n and -V change nothing; --flood, spoofing and other
TCP flags are refused with one line saying what to use (the list: docs/peer-flags.md).

Examples:
  lagtrace ping -c 5 10.0.0.2:8080
  lagtrace ping --connect -c 20 -i 200ms example.com:443
  lagtrace ping -S -p 80 -i u10000 -c 100 10.0.0.2")]
pub struct Args {
    /// Target: HOST, HOST:PORT, IP:PORT or [IPv6]:PORT
    pub target: String,
    /// Destination port (default 80 for TCP modes, 33434 for --udp); overrides HOST:PORT
    #[arg(short = 'p', long)]
    pub port: Option<u64>,
    /// Number of probes (1-1000000; Ctrl-C ends early and prints the statistics)
    #[arg(short = 'c', long, default_value_t = 4)]
    pub count: u32,
    /// Interval between probes: 10ms, 1s, 500us, seconds (0.2), or hping3's u10000 (µs)
    #[arg(short = 'i', long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// How long a probe waits for its reply before it counts as lost
    #[arg(short = 'W', long, default_value = "1s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// TTL / hop limit of the probes (1-255)
    #[arg(long, default_value_t = 64)]
    pub ttl: u64,
    /// TCP SYN probes from a raw socket: the default (hping3 -S)
    #[arg(short = 'S', long, conflicts_with_all = ["connect", "udp", "icmp"])]
    pub syn: bool,
    /// Timed connect() instead of raw SYNs (no privilege needed; completes handshakes)
    #[arg(long, conflicts_with_all = ["udp", "icmp"])]
    pub connect: bool,
    /// UDP probes; the ICMP port unreachable is the reply (needs CAP_NET_RAW; hping3 -2)
    #[arg(short = '2', long, conflicts_with = "icmp")]
    pub udp: bool,
    /// ICMP echo probes (needs CAP_NET_RAW; hping3 -1)
    #[arg(short = '1', long)]
    pub icmp: bool,
    /// Print the report as JSON (samples, stats, timestamp source) instead of text
    #[arg(long)]
    pub json: bool,
    /// Print version (-V is hping3's verbose here)
    #[arg(long, action = clap::ArgAction::Version)]
    version: (),
}

/// hping3's `u10000` (µs) or [`parse_duration`]'s forms.
fn parse_interval(s: &str) -> Result<Duration, String> {
    super::habits::hping_interval(s, parse_duration)
}

/// Parses `10ms`, `1s`, `500us`, `2m`-less plain seconds `0.5`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (use 10ms, 1s, 500us)"))?;
    if !v.is_finite() || v < 0.0 || v * scale > 3600.0 {
        return Err(format!("invalid duration {s:?}: must be 0-3600 s"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The timestamp source in a few words; how each is taken is in `--help` and `--json`.
fn short_times(ts: &str) -> String {
    match ts.strip_prefix(lagtrace_probe::net::TIMESTAMP_SOURCE_RAW) {
        Some(rest) => {
            let run = rest
                .trim()
                .trim_start_matches("[this run: ")
                .replacen(']', "", 1);
            format!("kernel software timestamps ({run})")
        }
        None => ts.to_string(),
    }
}

fn mode_label(m: PingMode) -> &'static str {
    match m {
        PingMode::Syn => "tcp-syn, raw socket",
        PingMode::Connect => "tcp connect(), completes handshakes",
        PingMode::Udp => "udp, raw socket",
        PingMode::Icmp => "icmp echo, raw socket",
    }
}

/// One hping3-style line for a sample.
pub fn sample_line(s: &Sample, timeout: Duration) -> String {
    let rtt = s
        .rtt_us
        .map(|r| format!("rtt={:.3} ms", r / 1000.0))
        .unwrap_or_default();
    let ip = s.from.map(|a| a.to_string()).unwrap_or_default();
    match s.kind {
        SampleKind::Lost => format!(
            "seq={} timeout: no reply in {} ms",
            s.seq,
            timeout.as_millis()
        ),
        SampleKind::Connected | SampleKind::Refused => format!(
            "ip={ip} seq={} {} {rtt}",
            s.seq,
            if s.kind == SampleKind::Connected {
                "connected"
            } else {
                "refused (RST)"
            }
        ),
        _ => {
            let mut l = format!(
                "len={} ip={ip} ttl={}",
                s.len.unwrap_or(0),
                s.ttl.unwrap_or(0)
            );
            if s.df == Some(true) {
                l.push_str(" DF");
            }
            if let Some(id) = s.ip_id {
                l.push_str(&format!(" id={id}"));
            }
            match s.kind {
                SampleKind::SynAck | SampleKind::Rst => l.push_str(&format!(
                    " sport={} flags={} seq={} win={} {rtt}",
                    s.sport.unwrap_or(0),
                    s.flags.as_deref().unwrap_or(""),
                    s.seq,
                    s.window.unwrap_or(0)
                )),
                SampleKind::EchoReply => l.push_str(&format!(" icmp_seq={} {rtt}", s.seq)),
                SampleKind::PortUnreachable => {
                    l.push_str(&format!(" ICMP port unreachable seq={} {rtt}", s.seq))
                }
                _ => l.push_str(&format!(
                    " ICMP {} code={} (not from the target) seq={} {rtt}",
                    match s.icmp_error {
                        Some(lagtrace_probe::wire::IcmpError::TimeExceeded) => "time exceeded",
                        _ => "destination unreachable",
                    },
                    s.icmp_code.unwrap_or(0),
                    s.seq
                )),
            }
            l
        }
    }
}

/// The closing statistics lines.
pub fn summary(r: &PingReport) -> String {
    let st = &r.stats;
    let mut s = format!(
        "\n--- {} lagtrace ping statistics ---\n{} packets transmitted, {} received, {}% packet loss\n",
        r.target,
        st.sent,
        st.received,
        fmt_pct(st.loss_pct)
    );
    if st.received > 0 {
        let t = &st.rtt;
        s.push_str(&format!(
            "round-trip min/avg/max/mdev = {:.3}/{:.3}/{:.3}/{:.3} ms (p50 {:.3}, p90 {:.3})\n",
            t.min_us / 1000.0,
            t.avg_us / 1000.0,
            t.max_us / 1000.0,
            t.mdev_us / 1000.0,
            t.p50_us / 1000.0,
            t.p90_us / 1000.0
        ));
    }
    s
}

fn fmt_pct(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{p:.0}")
    } else {
        format!("{p:.1}")
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (ip, hp) = lagtrace_probe::resolve_target(&args.target)?;
    let mode = if args.connect {
        PingMode::Connect
    } else if args.udp {
        PingMode::Udp
    } else if args.icmp {
        PingMode::Icmp
    } else {
        PingMode::Syn
    };
    let port = match args.port {
        Some(p) => lagtrace_probe::parse_port(&p.to_string())?,
        None => hp.unwrap_or(if mode == PingMode::Udp { 33434 } else { 80 }),
    };
    if args.ttl == 0 || args.ttl > 255 {
        bail!("invalid TTL {}: must be 1-255", args.ttl);
    }
    if args.count == 0 {
        bail!("invalid count 0: must be at least 1");
    }
    if args.count > lagtrace_probe::MAX_PING_COUNT {
        bail!(
            "invalid count {}: at most {} (every sample is kept for the statistics; Ctrl-C ends a run early with its statistics)",
            args.count,
            lagtrace_probe::MAX_PING_COUNT
        );
    }
    if args.timeout.is_zero() {
        bail!("invalid timeout 0: must be positive");
    }
    let opts = PingOptions {
        target: SocketAddr::new(ip, port),
        mode,
        count: args.count,
        interval: args.interval,
        timeout: args.timeout,
        ttl: args.ttl as u8,
        fallback_to_connect: true,
    };
    crate::interrupt::on_interrupt(|_| STOP.store(true, Ordering::Relaxed));
    let json = args.json;
    let mut out = std::io::stdout();
    let timeout = opts.timeout;
    let mut on_sample = |s: &Sample| {
        // Output closed (e.g. piped into `head`): stop probing.
        if !json && writeln!(out, "{}", sample_line(s, timeout)).is_err() {
            STOP.store(true, Ordering::Relaxed);
        }
    };
    // A target without a route is one line, with no header printed before it.
    lagtrace_probe::net::source_for(ip).with_context(|| format!("no route to {ip}"))?;
    // Decide the privilege question before the header, so the header names the mode that
    // really runs and a refusal is one line with nothing printed before it.
    let no_raw = mode != PingMode::Connect && !lagtrace_probe::net::have_cap_net_raw();
    if no_raw && mode != PingMode::Syn {
        bail!(
            "--{} probes need raw sockets (CAP_NET_RAW: run as root); --connect works without it",
            if mode == PingMode::Udp { "udp" } else { "icmp" }
        );
    }
    let fallback_said = no_raw && mode == PingMode::Syn;
    if !json {
        writeln!(
            std::io::stdout(),
            "LAGTRACE PING {} ({}): {} probes, interval {:?}, timeout {:?}",
            opts.target,
            mode_label(if fallback_said {
                PingMode::Connect
            } else {
                mode
            }),
            opts.count,
            opts.interval,
            opts.timeout
        )?;
    }
    if fallback_said {
        eprintln!(
            "lagtrace ping: no CAP_NET_RAW: SYN mode needs raw sockets; falling back to --connect (timed connect(), completes handshakes)"
        );
    }
    let report = lagtrace_probe::ping_with(&opts, &STOP, &mut on_sample)?;
    if json {
        writeln!(
            std::io::stdout(),
            "{}",
            serde_json::to_string_pretty(&lagtrace_model::Envelope::new(
                "ping",
                lagtrace_probe::json::ping_report(&report, &args.target)
            ))?
        )?;
    } else {
        if let Some(n) = report.note.as_ref().filter(|_| !fallback_said) {
            eprintln!("lagtrace ping: {n}");
        }
        write!(std::io::stdout(), "{}", summary(&report))?;
        writeln!(
            std::io::stdout(),
            "source {} ({}); times: {}",
            report.source,
            mode_label(report.mode),
            short_times(&report.timestamp_source)
        )?;
    }
    Ok(if report.stats.received > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FINDING)
    })
}
