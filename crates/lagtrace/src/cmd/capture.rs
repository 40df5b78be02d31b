//! `lagtrace capture`: libpcap capture (like `tcpdump -w`), in any network namespace.

use std::io::Write;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use lagtrace_netns::NetNs;
use lagtrace_packet::capture::{
    Capture, CaptureOptions, DEFAULT_BUFFER_BYTES, DEFAULT_SNAPLEN, FileFormat, PacketCallback,
    Stopper, linktype_name, summary_line,
};

/// Capture packets with libpcap (like tcpdump): to a file with -w, else one line per packet.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Needs CAP_NET_RAW (and CAP_SYS_ADMIN for --netns). Stops on -c, --duration or Ctrl-C and
prints packets captured / received by filter / dropped by kernel, like tcpdump.

Coming from tcpdump: -i, -w, -c, -s, -B (KiB; --buffer-mib takes MiB), -n (addresses are never
resolved) and a trailing filter mean the same here, -U is accepted (the file is complete when
the capture stops); reading a file (-r FILE) is `lagtrace analyze FILE`; the other flags (-v,
-A, -X, -D, -G, ...) are refused with one line saying what to use (docs/peer-flags.md).

Examples:
  lagtrace capture -i veth0 -w out.pcap tcp port 8080
  lagtrace capture --netns lt-default -i any -c 100 --pcapng -w out.pcapng
  lagtrace capture -n --target 10.0.0.2 --duration 5s")]
pub struct Args {
    /// Interface to capture on ("any" for all); default: the interface of the route to
    /// --target, else "any"
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    pub iface: Option<String>,
    /// Host whose route picks the default interface
    #[arg(long, value_name = "HOST")]
    pub target: Option<String>,
    /// Filter in tcpdump syntax (alternative to trailing words)
    #[arg(short = 'f', long = "filter", value_name = "EXPR")]
    pub filter: Option<String>,
    /// Write packets to FILE (pcap; pcapng with --pcapng) instead of printing them
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Write pcapng instead of pcap
    #[arg(long)]
    pub pcapng: bool,
    /// Stop after COUNT packets
    #[arg(short = 'c', long = "count", value_name = "COUNT",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 5s, 500ms, 2m)
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Bytes kept of each packet (0: the default, as in tcpdump)
    #[arg(short = 's', long = "snaplen", value_name = "SNAPLEN", default_value_t = DEFAULT_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(0..=DEFAULT_SNAPLEN as i64))]
    pub snaplen: u32,
    /// Capture inside this network namespace (as made by `ip netns add`)
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Kernel capture buffer in MiB
    #[arg(long = "buffer-mib", value_name = "MIB",
          default_value_t = DEFAULT_BUFFER_BYTES >> 20,
          value_parser = clap::value_parser!(u32).range(1..=MAX_BUFFER_MIB as i64))]
    pub buffer_mib: u32,
    /// Kernel capture buffer in KiB, as tcpdump's -B (instead of --buffer-mib)
    #[arg(short = 'B', value_name = "KiB", conflicts_with = "buffer_mib",
          value_parser = clap::value_parser!(u32).range(1..=(MAX_BUFFER_MIB as i64) << 10))]
    pub buffer_kib: Option<u32>,
    /// Put the interface in promiscuous mode
    #[arg(long)]
    pub promisc: bool,
    /// libpcap immediate mode: hand over each packet at once (default: in blocks within
    /// 50 ms; immediate mode drops more under a flood, see bench/capture_drops.sh)
    #[arg(long)]
    pub immediate: bool,
    /// Do not resolve addresses (tcpdump -n, -nn): always the case here
    #[arg(short = 'n', action = clap::ArgAction::Count)]
    pub numeric: u8,
    /// Filter expression in tcpdump syntax
    #[arg(trailing_var_arg = true, value_name = "FILTER")]
    pub expr: Vec<String>,
}

/// The largest kernel capture buffer `-B` takes, MiB (tcpdump takes any size and the kernel
/// then fails or pins that much memory; 1 GiB is 60 s of a saturated 10 Gbit/s ring).
pub const MAX_BUFFER_MIB: u32 = 1024;

/// Parses `5s`, `500ms`, `2m`, `1h`, `100us` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 5s, 500ms, 2m)"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use us, ms, s, m, h)"
            ));
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(format!("duration {s:?} out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn resolve(host: &str) -> Result<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    (host, 0)
        .to_socket_addrs()
        .with_context(|| format!("resolving --target {host}"))?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| anyhow!("--target {host}: no address"))
}

pub fn run(args: Args) -> Result<ExitCode> {
    let netns = NetNs::from_flag(args.netns.as_deref());
    if !netns.exists() {
        bail!(
            "network namespace {} does not exist",
            args.netns.as_deref().unwrap_or_default()
        );
    }
    let filter = match (&args.filter, args.expr.is_empty()) {
        (Some(_), false) => bail!("give the filter either with -f or as trailing words, not both"),
        (Some(f), true) => Some(f.clone()),
        (None, false) => Some(args.expr.join(" ")),
        (None, true) => None,
    };
    if args.pcapng && args.write.is_none() {
        bail!("--pcapng needs -w FILE");
    }
    if args.count == Some(0) {
        bail!("-c COUNT must be at least 1");
    }
    let iface = match (&args.iface, &args.target) {
        (Some(i), _) => i.clone(),
        (None, Some(t)) => {
            let ip = resolve(t)?;
            lagtrace_packet::capture::route_iface(ip, &netns).unwrap_or_else(|| "any".into())
        }
        (None, None) => "any".into(),
    };
    let opts = CaptureOptions {
        iface,
        filter,
        // As tcpdump: -s 0 means the default.
        snaplen: if args.snaplen == 0 {
            DEFAULT_SNAPLEN
        } else {
            args.snaplen
        },
        netns,
        buffer_bytes: match args.buffer_kib {
            Some(k) => k.saturating_mul(1 << 10),
            None => args.buffer_mib.saturating_mul(1 << 20),
        },
        count: args.count,
        duration: args.duration,
        output: args.write.clone(),
        format: if args.pcapng {
            FileFormat::Pcapng
        } else {
            FileFormat::Pcap
        },
        promisc: args.promisc,
        immediate: args.immediate,
    };
    // Set once the capture runs, so that a closed stdout (`| head`) can stop it.
    let stop_cell: Arc<OnceLock<Stopper>> = Arc::new(OnceLock::new());
    let callback: Option<PacketCallback> = if args.write.is_none() {
        let mut out = std::io::BufWriter::new(std::io::stdout());
        let cell = stop_cell.clone();
        Some(Box::new(move |p| {
            if writeln!(out, "{}", summary_line(p))
                .and_then(|_| out.flush())
                .is_err()
                && let Some(s) = cell.get()
            {
                s.stop();
            }
        }))
    } else {
        None
    };
    let handle = Capture::start(&opts, callback)?;
    let _ = stop_cell.set(handle.stopper());
    let (lt_name, lt_desc) = linktype_name(handle.linktype());
    eprintln!(
        "lagtrace capture: listening on {}, link-type {lt_name} ({lt_desc}), snapshot length {} bytes",
        handle.iface(),
        opts.snaplen
    );
    let stopper = handle.stopper();
    // Ctrl-C / SIGTERM: stop cleanly (drain, flush the file, print the counters).
    crate::interrupt::on_interrupt(move |_| stopper.stop());
    let st = handle.wait()?;
    eprintln!("{} packets captured", st.captured);
    eprintln!("{} packets received by filter", st.received_by_filter);
    eprintln!("{} packets dropped by kernel", st.dropped_by_kernel);
    if st.dropped_by_interface > 0 {
        eprintln!("{} packets dropped by interface", st.dropped_by_interface);
    }
    if let Some(e) = &st.error {
        // The counts above and the file hold what was captured before the failure.
        let kept = match &args.write {
            Some(w) => format!(
                " ({} packets before it are in {})",
                st.captured,
                w.display()
            ),
            None => String::new(),
        };
        eprintln!("lagtrace: error: {e}{kept}");
        return Ok(ExitCode::from(super::EXIT_ERROR));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
    }
}
