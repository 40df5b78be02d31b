//! `lagtrace lab`: the reference case as two hosts on this machine.

use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use lagtrace_lab::{Lab, LabOptions, LabState, ServerKind};
use serde::Serialize;

/// Build the reference case on this machine: a "server host" network namespace joined to
/// this one by a veth pair, running real nginx — good on :80 (stock, tcp_nodelay on) and
/// latency on :8080 (tcp_nodelay off) — or the built-in server.
///
/// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). State lives in /run/lagtrace/labs/NAME.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: LabCommand,
}

/// What to do with a lab.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Create the namespace, veth pair and servers, and print the URLs
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
    Down {
        /// Lab name
        #[arg(long, default_value = "default", conflicts_with = "all")]
        name: String,
        /// Every lab, including namespaces left behind by a crash
        #[arg(long)]
        all: bool,
    },
    /// List labs, their servers and whether they answer
    Status {
        /// As JSON
        #[arg(long)]
        json: bool,
    },
    /// Latency server: set tcp_nodelay on and reload it
    Fix {
        /// Lab name
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Latency server: set tcp_nodelay off again and reload it
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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
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
                println!("lab {n} is down");
            }
            if names.is_empty() {
                println!("no labs are up");
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Status { json } => status(json),
        LabCommand::Fix { name } => {
            Lab::open(&name)?.fix()?;
            println!("lab {name}: latency server now has tcp_nodelay on (reloaded)");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Unfix { name } => {
            Lab::open(&name)?.unfix()?;
            println!("lab {name}: latency server back to tcp_nodelay off (reloaded)");
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
    let st = lab.keep();
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        for n in &st.notes {
            eprintln!("lagtrace lab: {n}");
        }
        print_lab(&st);
        println!(
            "Capture on {}; `lagtrace lab fix --name {name}` sets tcp_nodelay on, `lagtrace lab down --name {name}` removes it all.",
            st.client_iface
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_lab(st: &LabState) {
    println!(
        "lab {}: namespace {}, {} {} (here) <-> {} {} (server host)",
        st.name, st.netns, st.client_iface, st.client_addr, st.server_iface, st.server_addr
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
        println!(
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
}

fn answers(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

#[derive(Serialize)]
struct StatusJson {
    labs: Vec<LabStatus>,
    orphan_namespaces: Vec<String>,
}

#[derive(Serialize)]
struct LabStatus {
    #[serde(flatten)]
    state: LabState,
    answering: Vec<bool>,
}

fn status(json: bool) -> anyhow::Result<ExitCode> {
    let labs = Lab::list();
    let orphans: Vec<String> = Lab::orphans()
        .into_iter()
        .map(|n| lagtrace_lab::netns_name(&n))
        .collect();
    if json {
        let out = StatusJson {
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
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if labs.is_empty() {
        println!("no labs are up");
    }
    for st in &labs {
        print_lab(st);
    }
    for o in &orphans {
        println!(
            "namespace {o} has no lab state (left by a crash?): `lagtrace lab down --all` removes it"
        );
    }
    Ok(ExitCode::SUCCESS)
}
