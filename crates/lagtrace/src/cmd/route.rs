//! `lagtrace route`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use lagtrace_probe::{HopReply, Proto, RouteOptions, RouteReport};

use super::ping::parse_duration;

/// Per-hop latency with TCP SYN (default), UDP or ICMP probes, all TTLs in flight at once.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Every probe of a trace (all TTLs, all queries) is sent at once and replies are matched by
probe identity, so a 30-hop trace takes about one timeout. The flow stays constant (Paris
traceroute): same addresses and ports for every probe; the probe is identified by the TCP
sequence number, the UDP checksum (payload chosen to give it) or the ICMP echo sequence
(payload chosen to keep the ICMP checksum constant). `*` is a probe nobody answered.
Addresses are always numeric (no reverse DNS; -n is accepted for traceroute compatibility).
Needs CAP_NET_RAW.

--report N runs N rounds (mtr style, one probe per hop per round unless -q is given, rounds
--interval apart) and prints per hop Loss%, Snt, Last, Avg, Best, Wrst, StDev in ms (StDev is
the sample standard deviation, n - 1, as mtr computes it).

Exit status: 0 the target answered; 1 it did not (the hops show where the path stops);
2 could not run (bad input, no route, missing privilege).

Coming from traceroute: -T (TCP SYN, the default), -I, -U, -p, -q, -m, -n, -w (wait) mean the
same here. From mtr: -r (report mode, 10 rounds) and -c N (rounds), -T, -u, -P (port), -j,
-n/--no-dns. Other flags (-f, -A, -i, --curses, ...) are refused with one line saying what to
use (the list: docs/peer-flags.md).

Examples:
  lagtrace route -n 10.0.0.2
  lagtrace route -T -w 2 -p 443 example.com
  lagtrace route -r -c 10 10.0.0.2")]
pub struct Args {
    /// Target host or address (a :PORT suffix sets the port)
    pub target: String,
    /// Destination port (default 80 for TCP, 33434 for UDP)
    #[arg(short = 'p', long)]
    pub port: Option<u64>,
    /// TCP SYN probes: the default (traceroute -T, mtr -T)
    #[arg(short = 'T', long, conflicts_with_all = ["udp", "icmp"])]
    pub tcp: bool,
    /// UDP probes
    #[arg(long, conflicts_with = "icmp")]
    pub udp: bool,
    /// ICMP echo probes
    #[arg(short = 'I', long)]
    pub icmp: bool,
    /// Probes per hop (default 3; 1 per round with --report)
    #[arg(short = 'q', long)]
    pub queries: Option<u64>,
    /// Maximum number of hops (TTL), 1-255
    #[arg(short = 'm', long = "max-hops", default_value_t = 30)]
    pub max_hops: u64,
    /// Do not resolve addresses to names (always the case: no reverse DNS is done)
    #[arg(short = 'n')]
    pub numeric: bool,
    /// How long to wait for replies after the last probe of a round (traceroute's -w)
    #[arg(short = 'W', visible_short_alias = 'w', long, default_value = "1s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// mtr-style report: run N rounds (1-100000) and print per-hop statistics
    #[arg(long, value_name = "N")]
    pub report: Option<u32>,
    /// mtr's -r: report mode, 10 rounds unless -c N says otherwise
    #[arg(short = 'r')]
    pub mtr_report: bool,
    /// mtr's -c N: N rounds of the report (the same as --report N)
    #[arg(
        short = 'c',
        long = "count",
        value_name = "N",
        conflicts_with = "report"
    )]
    pub count: Option<u32>,
    /// Time between rounds in --report mode
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

/// The most `--report` rounds: memory grows with rounds x hops x queries.
const MAX_ROUNDS: u32 = 100_000;

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

fn proto_label(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp-syn",
        Proto::Udp => "udp",
        Proto::Icmp => "icmp-echo",
    }
}

/// traceroute's annotation of an ICMP destination unreachable by code: `!N` network, `!H`
/// host, `!P` protocol, `!F` fragmentation needed, `!S` source route, `!X` administratively
/// prohibited, else `!<code>`.
pub fn unreachable_mark(ipv6: bool, code: Option<u8>) -> String {
    let Some(c) = code else {
        return "!".to_string();
    };
    let m = if ipv6 {
        match c {
            0 => "!N",
            1 => "!X",
            3 => "!H",
            4 => "!P",
            _ => "",
        }
    } else {
        match c {
            0 | 6 | 11 => "!N",
            1 | 7 | 12 => "!H",
            2 => "!P",
            4 => "!F",
            5 => "!S",
            9 | 10 | 13 => "!X",
            _ => "",
        }
    };
    if m.is_empty() {
        format!("!{c}")
    } else {
        m.to_string()
    }
}

/// traceroute-style lines.
pub fn render_trace(r: &RouteReport) -> String {
    let mut s = String::new();
    for h in &r.hops {
        let mut line = format!("{:>2} ", h.ttl);
        let mut last = None;
        for p in &h.probes {
            match (p.from, p.rtt_us) {
                (Some(a), Some(rtt)) => {
                    if last != Some(a) {
                        line.push_str(&format!(" {a}"));
                        last = Some(a);
                    }
                    line.push_str(&format!("  {} ms", ms(rtt)));
                    if p.reply == HopReply::Unreachable {
                        line.push(' ');
                        line.push_str(&unreachable_mark(r.target.is_ipv6(), p.code));
                    }
                }
                _ => line.push_str("  *"),
            }
        }
        s.push_str(&line);
        s.push('\n');
    }
    if !r.reached {
        s.push_str(&format!(
            "target {} did not answer within {} hops\n",
            r.target,
            r.hops.len()
        ));
    }
    s
}

/// mtr-style report table.
pub fn render_report(r: &RouteReport) -> String {
    let mut s = format!(
        "{:<4} {:<40} {:>6} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "", "HOST", "Loss%", "Snt", "Last", "Avg", "Best", "Wrst", "StDev"
    );
    for h in &r.hops {
        let host = if h.addrs.is_empty() {
            "???".to_string()
        } else {
            h.addrs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let t = &h.stats.rtt;
        let cols = if h.stats.received > 0 {
            format!(
                "{:>8} {:>8} {:>8} {:>8} {:>8}",
                ms(t.last_us),
                ms(t.avg_us),
                ms(t.min_us),
                ms(t.max_us),
                ms(t.stdev_us)
            )
        } else {
            format!("{:>8} {:>8} {:>8} {:>8} {:>8}", "-", "-", "-", "-", "-")
        };
        s.push_str(&format!(
            "{:>3}. {:<40} {:>5.1}% {:>5} {cols}\n",
            h.ttl, host, h.stats.loss_pct, h.stats.sent
        ));
    }
    s
}

pub fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    // mtr's -c N: N rounds of the report (with or without -r); -r alone: mtr's 10.
    if args.count.is_some() {
        args.report = args.count;
    } else if args.mtr_report && args.report.is_none() {
        args.report = Some(10);
    }
    let (ip, hp) = lagtrace_probe::resolve_target(&args.target)?;
    let proto = if args.udp {
        Proto::Udp
    } else if args.icmp {
        Proto::Icmp
    } else {
        Proto::Tcp
    };
    let port = match args.port {
        Some(p) => lagtrace_probe::parse_port(&p.to_string())?,
        None => hp.unwrap_or(if proto == Proto::Udp { 33434 } else { 80 }),
    };
    if args.max_hops == 0 || args.max_hops > 255 {
        bail!("invalid max hops {}: must be 1-255", args.max_hops);
    }
    let rounds = args.report.unwrap_or(1);
    if rounds == 0 {
        bail!("invalid --report 0: must be at least 1 round");
    }
    // Every probe of every round is kept for the per-hop statistics and --json.
    if rounds > MAX_ROUNDS {
        bail!("invalid --report {rounds}: at most {MAX_ROUNDS} rounds (every probe is kept)");
    }
    let queries = args
        .queries
        .unwrap_or(if args.report.is_some() { 1 } else { 3 });
    if queries == 0 || queries > 10 {
        bail!("invalid number of queries {queries}: must be 1-10");
    }
    if args.timeout.is_zero() {
        bail!("invalid timeout 0: must be positive");
    }
    // Refuse before the header: a missing route or privilege is one line, nothing before it.
    lagtrace_probe::net::source_for(ip).with_context(|| format!("no route to {ip}"))?;
    if !lagtrace_probe::net::have_cap_net_raw() {
        bail!(
            "route needs raw sockets (CAP_NET_RAW: run as root); `lagtrace ping --connect` works without it"
        );
    }
    let opts = RouteOptions {
        target: ip,
        proto,
        port,
        queries: queries as u8,
        max_ttl: args.max_hops as u8,
        timeout: args.timeout,
        rounds,
        round_interval: args.interval,
    };
    if !args.json {
        writeln!(
            std::io::stdout(),
            "lagtrace route to {ip} ({}{}, {} probe(s) per hop, {} hops max, all TTLs at once{})",
            proto_label(proto),
            if proto == Proto::Icmp {
                String::new()
            } else {
                format!(" port {port}")
            },
            queries,
            args.max_hops,
            if rounds > 1 {
                format!(", {rounds} rounds")
            } else {
                String::new()
            }
        )?;
    }
    let report = lagtrace_probe::route(&opts)?;
    if args.json {
        writeln!(
            std::io::stdout(),
            "{}",
            serde_json::to_string_pretty(&lagtrace_model::Envelope::new(
                "route",
                lagtrace_probe::json::route_report(&report, &args.target)
            ))?
        )?;
    } else if args.report.is_some() {
        write!(std::io::stdout(), "{}", render_report(&report))?;
    } else {
        write!(std::io::stdout(), "{}", render_trace(&report))?;
    }
    Ok(if report.reached {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FINDING)
    })
}
