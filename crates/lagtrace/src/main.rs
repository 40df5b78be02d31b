//! `lagtrace`: find where network request latency comes from, layer by layer, and say why.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmd;
mod interrupt;
mod logger;

/// Find where network request latency comes from, layer by layer, and say why.
///
/// An expert checks a slow service layer by layer: the path (SYN RTT, hops), the
/// application (latency at one request and under concurrency), the packets (what the TCP
/// streams show) and the sockets (how the server set them). lagtrace does each of these and
/// correlates them into one verdict with evidence, a fix, and a check that the fix worked.
#[derive(Debug, Parser)]
#[command(
    name = "lagtrace",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(after_help = "\
Start with `lagtrace demo` to see the reference case (nginx `tcp_nodelay off`, a 40 ms
Nagle/delayed-ACK stall) found, fixed and verified end to end on this machine.

Exit status: 0 success; 1 the command ran and found a problem (e.g. loss, a non-healthy
verdict); 2 the command could not run (bad usage, missing privilege, unreachable input);
130 interrupted (Ctrl-C: the command stops and prints what it measured).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// TCP SYN RTT to HOST[:PORT] (like hping3 -S); --connect, --udp, --icmp modes
    Ping(cmd::ping::Args),
    /// Per-hop latency with TCP/UDP/ICMP probes, all TTLs at once (like traceroute/mtr)
    Route(cmd::route::Args),
    /// HTTP/1.1 load with a latency distribution (like wrk, wrk2)
    Load(cmd::load::Args),
    /// Capture packets with libpcap, in any network namespace (like tcpdump -w)
    Capture(cmd::capture::Args),
    /// TCP streams, transactions, flow graph and latency findings of a pcap (like tshark)
    Analyze(cmd::analyze::Args),
    /// Live socket options and TCP_INFO of processes; record a command's socket calls
    Sockets(cmd::sockets::Args),
    /// The server host's kernel over a window: counters, listen queues, cgroup CPU, qdiscs
    Host(cmd::host::Args),
    /// Run every layer against URL, correlate them, and print the verdict
    Diagnose(cmd::diagnose::Args),
    /// Build the reference case on this machine: real nginx good/latency servers in a namespace
    Lab(cmd::lab::Args),
    /// Serve one port's server-side layers (capture, sockets, host) to `diagnose --agent`
    Agent(cmd::agent::Args),
    /// Run the built-in HTTP fault server (Nagle, think time, TCP_CORK, sizes)
    Serve(cmd::serve::Args),
    /// The reference case end to end: lab up, diagnose, fix, verify, lab down
    Demo(cmd::demo::Args),
    /// Shell completions for bash, zsh, fish, elvish or PowerShell
    Completions(cmd::shell::CompletionsArgs),
    /// Manual pages (roff), generated from the same definitions as --help
    Man(cmd::shell::ManArgs),
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match cmd::habits::parse::<Cli>(args.clone()) {
        cmd::habits::Parsed::Ok(cli, notes) => {
            for n in notes {
                eprintln!("lagtrace: note: {n}");
            }
            cli
        }
        cmd::habits::Parsed::Refused(line) => {
            eprintln!("lagtrace: error: {line}");
            return ExitCode::from(cmd::EXIT_ERROR);
        }
        cmd::habits::Parsed::Clap(e) => {
            if let Some(line) = cmd::habits::explain(&e, &args, &Cli::command()) {
                eprintln!("lagtrace: error: {line}");
                return ExitCode::from(cmd::EXIT_ERROR);
            }
            e.exit()
        }
    };
    logger::install();
    // The agent installs it after giving up its capabilities, so that the handler's thread
    // does not keep them (capability sets are per thread).
    if !matches!(cli.command, Command::Agent(_)) {
        interrupt::install();
    }
    let result = match cli.command {
        Command::Ping(a) => cmd::ping::run(a),
        Command::Route(a) => cmd::route::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Capture(a) => cmd::capture::run(a),
        Command::Analyze(a) => cmd::analyze::run(a),
        Command::Sockets(a) => cmd::sockets::run(a),
        Command::Diagnose(a) => cmd::diagnose::run(a),
        Command::Host(a) => cmd::host::run(a),
        Command::Lab(a) => cmd::lab::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Agent(a) => cmd::agent::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Completions(a) => cmd::shell::completions(a, Cli::command()),
        Command::Man(a) => cmd::shell::man(a, Cli::command()),
    };
    let code = match result {
        Ok(code) => code,
        Err(err) => cmd::report_error(&err),
    };
    // An interrupted run exits 130 whatever it printed (README, "Exit status").
    if interrupt::interrupted() {
        ExitCode::from(interrupt::EXIT_INTERRUPTED)
    } else {
        code
    }
}
