//! `lagtrace serve`: the built-in HTTP/1.1 fault server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use lagtrace_lab::serve::{DEFAULT_BODY_SIZE, ServeOptions, Server};
use lagtrace_netns::NetNs;

/// Run the built-in HTTP/1.1 keep-alive server with a chosen socket behaviour.
///
/// `--nodelay off --split-writes` reproduces the reference case's 40 ms stall (Nagle holds
/// the body until the client's delayed ACK); `--nodelay on` is the fix. Runs until
/// Ctrl-C/SIGTERM and then logs how many requests it answered.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace serve --listen 127.0.0.1:8080 --nodelay off --split-writes
  lagtrace serve --listen 127.0.0.1:8081 --think 5
  lagtrace serve --listen [::1]:8080 --nodelay on")]
pub struct Args {
    /// Address and port to listen on
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// TCP_NODELAY on accepted sockets (off = Nagle's algorithm on)
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub nodelay: bool,
    /// Write headers and body with two write() calls (one otherwise)
    #[arg(long)]
    pub split_writes: bool,
    /// Think time before each response, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub think: u64,
    /// Set TCP_CORK on accepted sockets and leave it on
    #[arg(long)]
    pub cork: bool,
    /// Response body size in bytes
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BODY_SIZE)]
    pub body_size: usize,
    /// Listen inside this named network namespace (/run/netns/NAME)
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.body_size > 1 << 30 {
        bail!("--body-size {} is above 1 GiB", args.body_size);
    }
    if args.think > 600_000 {
        bail!("--think {} ms is above 10 minutes", args.think);
    }
    let netns = NetNs::from_flag(args.netns.as_deref());
    if !netns.exists() {
        bail!(
            "network namespace {} does not exist",
            args.netns.unwrap_or_default()
        );
    }
    let opts = ServeOptions {
        listen: args.listen,
        nodelay: args.nodelay,
        split_writes: args.split_writes,
        think: Duration::from_millis(args.think),
        cork: args.cork,
        body_size: args.body_size,
        netns,
    };
    let server =
        Server::spawn(opts.clone()).with_context(|| format!("listening on {}", args.listen))?;
    let stop = server.stopper();
    crate::interrupt::on_interrupt(move |_| stop.store(true, Ordering::Relaxed));
    eprintln!(
        "lagtrace serve: listening on {} (pid {}): nodelay {}, {} write(s) per response, think {} ms, cork {}, body {} bytes",
        server.local_addr(),
        std::process::id(),
        if opts.nodelay { "on" } else { "off" },
        if opts.split_writes { 2 } else { 1 },
        args.think,
        if opts.cork { "on" } else { "off" },
        opts.body_size
    );
    let counter = server.request_counter();
    let stop = server.stopper();
    // Log the request count every 10 s while it changes, and at the end.
    let mut logged = 0;
    let mut ticks = 0u32;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        let n = counter.load(Ordering::Relaxed);
        if ticks.is_multiple_of(100) && n != logged {
            eprintln!("lagtrace serve: {n} requests");
            logged = n;
        }
    }
    server.wait();
    eprintln!(
        "lagtrace serve: stopped after {} requests",
        counter.load(Ordering::Relaxed)
    );
    Ok(ExitCode::SUCCESS)
}
