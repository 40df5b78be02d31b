//! `lagtrace lab`: the reference case as two hosts on this machine.

/// `println!` that returns the write error (a closed pipe, as under `| head`) instead of
/// panicking; `report_error` turns a broken pipe into a silent exit 0.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($t)*)?
    }};
}

use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use lagtrace_lab::{Lab, LabOptions, LabState, LabStatus, LabStatusReport, ServerKind};

/// Build the reference case on this machine: a "server host" network namespace joined to
/// this one by a veth pair, running real nginx — good on :80 (stock, tcp_nodelay on) and
/// latency on :8080 (tcp_nodelay off) — or the built-in server.
///
/// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). State lives in /run/lagtrace/labs/NAME.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace lab up
  lagtrace lab fix && lagtrace lab status
  lagtrace lab down --all")]
pub struct Args {
    #[command(subcommand)]
    pub command: LabCommand,
}

/// What to do with a lab.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Create the namespace, veth pair and servers, and print the URLs
    #[command(
        after_help = "Examples:\n  lagtrace lab up\n  lagtrace lab up --name b --server builtin --json"
    )]
    Up {
        /// Lab name ([A-Za-z0-9_-], at most 24 characters)
        #[arg(long, default_value = "default")]
        name: String,
        /// Which servers to run (nginx falls back to builtin when nginx is missing)
        #[arg(long, value_enum, default_value_t = Server::Nginx)]
        server: Server,
        /// Print namespace, interfaces, addresses, ports, pids and config paths as JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop the lab's processes and remove its namespace, links and state (idempotent)
    #[command(after_help = "Examples:\n  lagtrace lab down\n  lagtrace lab down --all")]
    Down {
        /// Lab name
        #[arg(long, default_value = "default", conflicts_with = "all")]
        name: String,
        /// Every lab, including namespaces left behind by a crash
        #[arg(long)]
        all: bool,
    },
    /// List labs, their servers and whether they answer (exit 1 if --name is not up)
    #[command(
        after_help = "Examples:\n  lagtrace lab status\n  lagtrace lab status --name default --json"
    )]
    Status {
        /// Only this lab
        #[arg(long)]
        name: Option<String>,
        /// As JSON
        #[arg(long)]
        json: bool,
    },
    /// Latency server: set tcp_nodelay on and reload it
    ///
    /// Applies the fix `diagnose` names for the case: the latency nginx's `tcp_nodelay off;`
    /// line becomes `tcp_nodelay on;` (nothing else in the file changes), nginx reloads, and
    /// the line changed is printed. A built-in latency server restarts with TCP_NODELAY on.
    #[command(after_help = "Examples:\n  lagtrace lab fix\n  lagtrace lab fix --name b")]
    Fix {
        /// Lab name
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Latency server: set tcp_nodelay off again and reload it
    #[command(after_help = "Examples:\n  lagtrace lab unfix\n  lagtrace lab unfix --name b")]
    Unfix {
        /// Lab name
        #[arg(long, default_value = "default")]
        name: String,
    },
}

/// Server kind of `lab up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Server {
    /// Real nginx from the Debian package
    Nginx,
    /// `lagtrace serve` processes (nodelay on / nodelay off with split writes)
    Builtin,
}

/// Set by Ctrl-C. Every lab subcommand changes namespaces, links, processes or configs in
/// steps; dying between two steps (SIGINT's default) left a half-built lab behind. The
/// command finishes its step sequence instead, and `up` then takes its lab down again.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::interrupt::on_interrupt(|_| INTERRUPTED.store(true, Ordering::SeqCst));
    match args.command {
        LabCommand::Up { name, server, json } => up(&name, server, json),
        LabCommand::Down { name, all } => {
            let names: Vec<String> = if all {
                let mut v: Vec<String> = Lab::list().into_iter().map(|s| s.name).collect();
                v.extend(Lab::orphans());
                v
            } else {
                vec![name]
            };
            for n in &names {
                Lab::down(n).with_context(|| format!("lab down {n}"))?;
                outln!("lab {n} is down");
            }
            if names.is_empty() {
                outln!("no labs are up");
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Status { name, json } => status(name.as_deref(), json),
        LabCommand::Fix { name } => {
            match Lab::open(&name)?.fix()? {
                Some(e) => outln!("lab {name}: {} (nginx reloaded)", e.describe()),
                None => outln!("lab {name}: latency server restarted with TCP_NODELAY on"),
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Unfix { name } => {
            match Lab::open(&name)?.unfix()? {
                Some(e) => outln!("lab {name}: {} (nginx reloaded)", e.describe()),
                None => outln!("lab {name}: latency server restarted with TCP_NODELAY off"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn up(name: &str, server: Server, json: bool) -> anyhow::Result<ExitCode> {
    let kind = match server {
        Server::Nginx => ServerKind::Nginx,
        Server::Builtin => ServerKind::BuiltinProcess(
            std::env::current_exe().context("finding the lagtrace executable")?,
        ),
    };
    let lab = Lab::up(&LabOptions::new(name).server(kind))?;
    if INTERRUPTED.load(Ordering::SeqCst) {
        drop(lab); // tears down everything it made
        bail!("interrupted; lab {name:?} was not left up");
    }
    let st = lab.keep();
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&lagtrace_model::Envelope::new("lab up", &st))?
        );
    } else {
        for n in &st.notes {
            eprintln!("lagtrace lab: {n}");
        }
        print_lab(&st)?;
        outln!(
            "Capture on {}; `lagtrace lab fix --name {name}` sets tcp_nodelay on, `lagtrace lab down --name {name}` removes it all.",
            st.client_iface
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_lab(st: &LabState) -> std::io::Result<()> {
    outln!(
        "lab {}: namespace {}, {} {} (here) <-> {} {} (server host)",
        st.name,
        st.netns,
        st.client_iface,
        st.client_addr,
        st.server_iface,
        st.server_addr
    );
    for s in &st.servers {
        let what = match (s.role.as_str(), s.fixed) {
            ("good", _) => "tcp_nodelay on",
            ("latency", false) => "tcp_nodelay off",
            ("latency", true) => "tcp_nodelay on (fixed)",
            _ => "",
        };
        let pid = s
            .pid
            .map(|p| format!("pid {p}"))
            .unwrap_or_else(|| "in-process".into());
        let answers = answers(SocketAddr::from((st.server_addr, s.port)));
        outln!(
            "  {:<8} http://{}:{}/  {} {}  {}  {}",
            s.role,
            st.server_addr,
            s.port,
            s.kind,
            pid,
            what,
            if answers { "answers" } else { "NOT ANSWERING" }
        );
    }
    Ok(())
}

fn answers(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

fn status(name: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    if let Some(n) = name {
        lagtrace_lab::validate_name(n)?;
    }
    let wanted = |n: &str| name.is_none_or(|w| w == n);
    let labs: Vec<LabState> = Lab::list()
        .into_iter()
        .filter(|s| wanted(&s.name))
        .collect();
    let orphans: Vec<String> = Lab::orphans()
        .into_iter()
        .filter(|n| wanted(n))
        .map(|n| lagtrace_lab::netns_name(&n))
        .collect();
    let code = if name.is_some() && labs.is_empty() {
        ExitCode::from(super::EXIT_FINDING)
    } else {
        ExitCode::SUCCESS
    };
    if json {
        let out = LabStatusReport {
            labs: labs
                .into_iter()
                .map(|s| {
                    let answering = s
                        .servers
                        .iter()
                        .map(|x| answers(SocketAddr::from((s.server_addr, x.port))))
                        .collect();
                    LabStatus {
                        state: s,
                        answering,
                    }
                })
                .collect(),
            orphan_namespaces: orphans,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&lagtrace_model::Envelope::new("lab status", &out))?
        );
        return Ok(code);
    }
    match name {
        Some(n) if labs.is_empty() => outln!("lab {n} is not up"),
        None if labs.is_empty() => outln!("no labs are up"),
        _ => {}
    }
    for st in &labs {
        print_lab(st)?;
    }
    for o in &orphans {
        outln!(
            "namespace {o} has no lab state (left by a crash?): `lagtrace lab down --all` removes it"
        );
    }
    Ok(code)
}
