//! lagtrace-probe: path latency without relying on ICMP.
//!
//! - [`ping()`]: TCP SYN (raw socket; the kernel resets the SYN-ACK), timed `connect()`, UDP or
//!   ICMP echo probes to one target; every probe is a [`Sample`] (timeouts included).
//! - [`route()`]: TCP SYN, UDP or ICMP probes at every TTL at once, one flow per trace
//!   (Paris style), replies matched by probe identity; `rounds > 1` gives mtr-style totals.
//!
//! The reports are the engine's own types (`loss_pct` 0–100, `f64` µs); [`json`] turns them
//! into the `lagtrace-model` JSON reports (`loss_share` 0–1, `*_us`).
//!
//! Both run in the calling thread's network namespace (wrap in `lagtrace_netns::NetNs::run`
//! to probe from another one) and are safe to call from a background thread.
//! The network sits behind [`net::Network`]; the engines are unit-tested on a simulation.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use lagtrace_probe::{PingMode, PingOptions, RouteOptions};
//!
//! // SYN RTT to a port (falls back to timed connect() without CAP_NET_RAW).
//! let mut o = PingOptions::new("10.0.0.2:80".parse().unwrap());
//! o.count = 20;
//! o.interval = Duration::from_millis(50);
//! let stop = AtomicBool::new(false); // set it from another thread to end early
//! let idle = lagtrace_probe::ping(&o, &stop)?;
//! println!("{} µs median, {}% loss, {:?}", idle.stats.rtt.p50_us, idle.stats.loss_pct, idle.mode);
//!
//! // In another namespace: lagtrace_netns::NetNs::Named("ns".into()).run(|| lagtrace_probe::ping(&o, &stop))
//! let trace = lagtrace_probe::route(&RouteOptions::new("10.0.0.2".parse().unwrap()))?;
//! for h in &trace.hops {
//!     println!("{} {:?} {:.1}% loss", h.ttl, h.addrs, h.stats.loss_pct);
//! }
//! # let _ = PingMode::Syn;
//! # Ok::<(), lagtrace_probe::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
pub mod json;
pub mod net;
pub mod ping;
pub mod route;
pub mod stats;
pub mod wire;

#[cfg(test)]
mod sim;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicBool;

use lagtrace_model::{Capability, Privilege};

pub use error::{Error, Result};

/// Returns `Err(Error::Target(format!(...)))`.
macro_rules! bail_target {
    ($($arg:tt)*) => {
        return Err(Error::Target(format!($($arg)*)))
    };
}

/// Returns `Err(Error::Usage(format!(...)))`.
macro_rules! bail_usage {
    ($($arg:tt)*) => {
        return Err(Error::Usage(format!($($arg)*)))
    };
}
pub use ping::{PingMode, PingOptions, PingReport, PingStats, Sample, SampleKind};
pub use route::{Hop, HopProbe, HopReply, HopStats, RouteOptions, RouteReport};
pub use stats::RttStats;
pub use wire::Proto;

/// Parses `HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address, resolving names with
/// getaddrinfo. Returns the address and the port if one was given. The address is one
/// unicast host: an IPv4-mapped IPv6 address becomes IPv4; the unspecified address,
/// multicast, broadcast and `%scope` suffixes are refused (probes to them never come back as
/// replies from one host).
pub fn resolve_target(s: &str) -> Result<(IpAddr, Option<u16>)> {
    if s.contains('%') {
        bail_target!(
            "{s:?}: scoped addresses (%IFACE) are not supported; use a global or unique-local address"
        );
    }
    let (ip, port) = resolve_any(s)?;
    let ip = ip.to_canonical();
    let what = if ip.is_unspecified() {
        "the unspecified address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if ip == IpAddr::from([255, 255, 255, 255]) {
        "the broadcast address"
    } else {
        return Ok((ip, port));
    };
    bail_target!("{ip} is {what}, not one host to probe")
}

fn resolve_any(s: &str) -> Result<(IpAddr, Option<u16>)> {
    let s = s.trim();
    if s.is_empty() {
        bail_target!("empty target");
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| Error::Target(format!("{s:?}: missing ']'")))?;
        let port = match tail {
            "" => None,
            t => Some(
                t.strip_prefix(':')
                    .ok_or_else(|| Error::Target(format!("{s:?}: expected ':PORT' after ']'")))?,
            ),
        };
        (h, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(parse_port(p)?),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok((ip, port));
    }
    let addr = (host, 0u16)
        .to_socket_addrs()
        .map_err(|e| Error::Target(format!("cannot resolve host {host:?}: {e}")))?
        .next()
        .ok_or_else(|| Error::Target(format!("cannot resolve host {host:?}: no address")))?;
    Ok((addr.ip(), port))
}

/// A port in 1..=65535, with a one-line error otherwise.
pub fn parse_port(p: &str) -> Result<u16> {
    let n: u64 = p
        .parse()
        .map_err(|_| Error::Usage(format!("invalid port {p:?}: not a number")))?;
    if n == 0 || n > 65535 {
        bail_usage!("invalid port {n}: must be 1-65535");
    }
    Ok(n as u16)
}

fn seq_base() -> u32 {
    let t = net::mono_ns();
    (t as u32) ^ (std::process::id().rotate_left(16)) ^ ((t >> 32) as u32)
}

/// The most probes one ping run takes: every sample is kept (for the statistics, the JSON
/// report and `diagnose`), so memory grows with the count (about 200 bytes a probe).
pub const MAX_PING_COUNT: u32 = 1_000_000;

/// Runs `opts.count` probes (or until `stop` is set) and returns every sample.
/// `Err` only when probing cannot run (no route, no privilege without fallback, bad input).
pub fn ping(opts: &PingOptions, stop: &AtomicBool) -> Result<PingReport> {
    ping_with(opts, stop, &mut |_| {})
}

/// [`ping()`] that also calls `on_sample` as each probe resolves (for live output).
pub fn ping_with(
    opts: &PingOptions,
    stop: &AtomicBool,
    on_sample: &mut dyn FnMut(&Sample),
) -> Result<PingReport> {
    if opts.target.port() == 0 && opts.mode != PingMode::Icmp {
        bail_usage!("invalid port 0: must be 1-65535");
    }
    if opts.ttl == 0 {
        bail_usage!("invalid TTL 0: must be 1-255");
    }
    if opts.count > MAX_PING_COUNT {
        bail_usage!(
            "invalid count {}: at most {MAX_PING_COUNT} (every sample is kept for the statistics)",
            opts.count
        );
    }
    let src = net::source_for(opts.target.ip()).map_err(|err| Error::NoRoute {
        dst: opts.target.ip(),
        err,
    })?;
    let mut mode = opts.mode;
    let mut note = None;
    if mode != PingMode::Connect && !net::have_cap_net_raw() {
        if mode == PingMode::Syn && opts.fallback_to_connect {
            mode = PingMode::Connect;
            note = Some(
                "no CAP_NET_RAW: SYN mode needs raw sockets; fell back to --connect (timed connect(), completes handshakes)"
                    .to_string(),
            );
        } else {
            return Err(Privilege::new(
                Capability::NetRaw,
                format!("sending {mode:?} probes"),
                " (raw sockets: run as root); --connect works without it",
            )
            .into());
        }
    }
    if mode == PingMode::Connect {
        let (samples, source) = ping::run_connect(opts, stop, on_sample)
            .map_err(|e| Error::io(format!("probing {}", opts.target), e))?;
        return Ok(PingReport {
            target: opts.target,
            source,
            mode,
            timestamp_source: "CLOCK_MONOTONIC around connect() (user space)".to_string(),
            note,
            stats: PingStats::of(&samples),
            samples,
        });
    }
    let proto = match mode {
        PingMode::Udp => Proto::Udp,
        PingMode::Icmp => Proto::Icmp,
        _ => Proto::Tcp,
    };
    let (_hold, sport) = match proto {
        Proto::Tcp => {
            let (s, p) =
                net::hold_tcp_port(src).map_err(|e| Error::io("holding a local TCP port", e))?;
            (Some(s), p)
        }
        Proto::Udp => {
            let (s, p) =
                net::hold_udp_port(src).map_err(|e| Error::io("holding a local UDP port", e))?;
            (Some(s), p)
        }
        Proto::Icmp => (None, 0),
    };
    let flow = wire::Flow {
        proto,
        src,
        dst: opts.target.ip(),
        sport,
        dport: opts.target.port(),
        seq_base: seq_base(),
    };
    let mut network = net::RawNetwork::open(flow).map_err(Error::raw_open)?;
    let samples = ping::run_probes(&mut network, &flow, opts, stop, on_sample)
        .map_err(|e| Error::io(format!("probing {}", opts.target), e))?;
    let mut ts = format!(
        "{} [this run: {} sends with kernel TX timestamps, {} with user-space send times]",
        net::TIMESTAMP_SOURCE_RAW,
        network.tx_kernel,
        network.tx_user
    );
    if network.untimestamped > 0 {
        ts.push_str(&format!(
            " ({} replies had no kernel timestamp: user-space CLOCK_MONOTONIC at read)",
            network.untimestamped
        ));
    }
    Ok(PingReport {
        target: opts.target,
        source: SocketAddr::new(src, sport),
        mode,
        timestamp_source: ts,
        note,
        stats: PingStats::of(&samples),
        samples,
    })
}

/// Traces the path to `opts.target`. Needs CAP_NET_RAW.
pub fn route(opts: &RouteOptions) -> Result<RouteReport> {
    route_until(opts, &std::sync::atomic::AtomicBool::new(false))
}

/// [`route`], ending early (with the hops so far) within 50 ms once `stop` is set.
pub fn route_until(
    opts: &RouteOptions,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<RouteReport> {
    if opts.max_ttl == 0 {
        bail_usage!("invalid max TTL 0: must be 1-255");
    }
    if opts.queries == 0 {
        bail_usage!("invalid number of queries 0: must be at least 1");
    }
    if opts.port == 0 && opts.proto != Proto::Icmp {
        bail_usage!("invalid port 0: must be 1-65535");
    }
    let probes = u64::from(opts.queries) * u64::from(opts.max_ttl);
    if probes > u64::from(wire::MAX_ID) {
        bail_usage!(
            "too many probes per round ({probes}): queries x max TTL must be at most {}",
            wire::MAX_ID
        );
    }
    let src = net::source_for(opts.target).map_err(|err| Error::NoRoute {
        dst: opts.target,
        err,
    })?;
    if !net::have_cap_net_raw() {
        return Err(Privilege::new(
            Capability::NetRaw,
            "route",
            " (raw sockets: run as root); `lagtrace ping --connect` works without it",
        )
        .into());
    }
    let (_hold, sport) = match opts.proto {
        Proto::Tcp => {
            let (s, p) =
                net::hold_tcp_port(src).map_err(|e| Error::io("holding a local TCP port", e))?;
            (Some(s), p)
        }
        Proto::Udp => {
            let (s, p) =
                net::hold_udp_port(src).map_err(|e| Error::io("holding a local UDP port", e))?;
            (Some(s), p)
        }
        Proto::Icmp => (None, 0),
    };
    let flow = wire::Flow {
        proto: opts.proto,
        src,
        dst: opts.target,
        sport,
        dport: opts.port,
        seq_base: seq_base(),
    };
    let mut network = net::RawNetwork::open(flow).map_err(Error::raw_open)?;
    let (hops, reached) = route::run_trace(&mut network, &flow, opts, stop)
        .map_err(|e| Error::io(format!("tracing {}", opts.target), e))?;
    Ok(RouteReport {
        target: opts.target,
        source: src,
        proto: opts.proto,
        port: opts.port,
        source_port: sport,
        rounds: opts.rounds,
        timestamp_source: net::TIMESTAMP_SOURCE_RAW.to_string(),
        hops,
        reached,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            resolve_target("10.0.0.2:80").unwrap(),
            (ip("10.0.0.2"), Some(80))
        );
        assert_eq!(resolve_target("10.0.0.2").unwrap(), (ip("10.0.0.2"), None));
        assert_eq!(resolve_target("[::1]:443").unwrap(), (ip("::1"), Some(443)));
        assert_eq!(resolve_target("::1").unwrap(), (ip("::1"), None));
        assert_eq!(resolve_target("[fd00::2]").unwrap(), (ip("fd00::2"), None));
        assert_eq!(resolve_target("localhost:22").unwrap().1, Some(22));
        let e = resolve_target("10.0.0.2:0").unwrap_err().to_string();
        assert!(e.contains("1-65535"), "{e}");
        let e = resolve_target("10.0.0.2:70000").unwrap_err().to_string();
        assert!(e.contains("1-65535"), "{e}");
        let e = format!(
            "{:#}",
            resolve_target("no-such-host.invalid:80").unwrap_err()
        );
        assert!(e.contains("cannot resolve host"), "{e}");
        // One unicast host only.
        assert_eq!(
            resolve_target("::ffff:10.0.0.2").unwrap(),
            (ip("10.0.0.2"), None)
        );
        assert_eq!(
            resolve_target("[::ffff:10.0.0.2]:80").unwrap(),
            (ip("10.0.0.2"), Some(80))
        );
        for bad in [
            "0.0.0.0",
            "::",
            "[::]:80",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255:80",
        ] {
            let e = resolve_target(bad).unwrap_err().to_string();
            assert!(e.contains("not one host"), "{bad}: {e}");
        }
        let e = resolve_target("fe80::1%lo").unwrap_err().to_string();
        assert!(e.contains("scoped addresses"), "{e}");
    }

    #[test]
    fn a_count_beyond_the_kept_samples_is_refused() {
        let mut o = PingOptions::new("127.0.0.1:80".parse().unwrap());
        o.count = MAX_PING_COUNT + 1;
        let e = ping(&o, &AtomicBool::new(false)).unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
    }
}
