//! `lagtrace agent`: serves the server-side layers of one port to `diagnose --agent`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use lagtrace_agent::auth::Token;
use lagtrace_agent::{AgentConfig, caps, tls};

/// Test only: microseconds added to the agent's clock (its clock replies
/// and its captures), so a test can check the client's offset estimate against a known skew.
const SKEW_ENV: &str = "LAGTRACE_AGENT_TEST_SKEW_US";

/// Serve, on the server's host, the server-side layers of ONE listening port to
/// `lagtrace diagnose URL --agent ADDR:PORT` on another host: the port owner's sockets and
/// options (and config lens), the host layer's deltas over a window, and a capture of the
/// requesting client's connections to the port over that window.
///
/// TLS with a fresh self-signed certificate: the agent prints its SHA-256 fingerprint,
/// which the client pins (--agent-fingerprint). Every request needs the shared token
/// (--token-file FILE or $LAGTRACE_AGENT_TOKEN, at least 16 characters; never a flag).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Bounds: one session at a time, windows up to --max-window, results dropped --grace after
the window's end; --rate requests/s (bursts of twice that) for all clients, and as much again
for refusals (a flood without the token cannot starve its holder); request bodies up to 4 KiB.
After start the agent keeps only CAP_NET_RAW (capture), CAP_SYS_PTRACE (socket options),
CAP_BPF and CAP_PERFMON (drops by reason) and CAP_SYS_ADMIN (namespaces); it says which of
those it lacks and the layers needing them say so in the diagnosis; no_new_privs is set, and a
seccomp filter refuses with EPERM, on every thread and in every program it runs: ptrace,
process_vm_readv/writev, mount, umount2, pivot_root, chroot and the new mount API, module
loading, kexec, reboot, swap, acct, iopl/ioperm, setting the clock or host name,
open_by_handle_at, the keyring calls and userfaultfd.
The client: lagtrace diagnose URL --agent ADDR:PORT --agent-fingerprint sha256:HEX
(token from --agent-token-file FILE or $LAGTRACE_AGENT_TOKEN).

Examples:
  lagtrace agent --listen 10.0.0.2:7700 --port 8080 --token-file /etc/lagtrace-token
  lagtrace agent --listen 10.0.0.2:7700 --port 443 --max-window 1m --rate 5")]
pub struct Args {
    /// Address to listen on
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// The listening port whose owner is served (no other process is inspected)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// File holding the shared token (default: $LAGTRACE_AGENT_TOKEN)
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Also write the certificate's fingerprint to FILE
    #[arg(long, value_name = "FILE")]
    fingerprint_file: Option<PathBuf>,
    /// Longest window a session may ask for
    #[arg(long, default_value = "10m", value_parser = super::positive_duration)]
    max_window: Duration,
    /// How long a session's results wait for the client after its window
    #[arg(long, default_value = "30s", value_parser = super::positive_duration)]
    grace: Duration,
    /// Requests per second allowed, all clients together (bursts of twice that)
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rate: u32,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let token = Token::load(args.token_file.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let skew_us: i64 = match std::env::var(SKEW_ENV) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{SKEW_ENV}={v:?}: expected microseconds"))?,
        Err(_) => 0,
    };
    let (tls_cfg, fp) = tls::server_identity().map_err(|e| anyhow::anyhow!("{e}"))?;
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("listening on {}", args.listen))?;
    if let Some(p) = &args.fingerprint_file {
        std::fs::write(p, format!("{fp}\n")).with_context(|| format!("writing {}", p.display()))?;
    }
    // Tracefs before the seccomp filter refuses `mount` (`ip netns exec` gives a fresh /sys
    // without it): the host layer's tracepoints are read there.
    let tracefs = lagtrace_host::prepare_tracefs();
    // Before any thread starts: threads made later inherit the reduced sets.
    let dropped = caps::drop_to_needed().context("dropping capabilities")?;
    // And the system calls no layer needs, on every thread and every program it runs.
    lagtrace_agent::seccomp::install_all_threads()
        .map_err(|e| anyhow::anyhow!("installing the seccomp filter: {e}"))?;
    crate::interrupt::install();
    let mut cfg = AgentConfig::new(args.port, token);
    cfg.max_window = args.max_window;
    cfg.grace = args.grace;
    cfg.rate_per_sec = f64::from(args.rate);
    cfg.burst = args.rate.saturating_mul(2);
    cfg.skew_ns = skew_us.saturating_mul(1000);
    let mut out = std::io::stdout();
    writeln!(
        out,
        "lagtrace agent on {} for the owner of port {}",
        listener.local_addr()?,
        args.port
    )?;
    let names = |v: &[lagtrace_model::Capability]| {
        v.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
    };
    writeln!(out, "capabilities kept: {}", names(&dropped.kept))?;
    if !dropped.missing.is_empty() {
        writeln!(
            out,
            "capabilities missing: {} (the layers needing them will say so)",
            names(&dropped.missing)
        )?;
    }
    writeln!(
        out,
        "seccomp: {} system calls refused (ptrace, process_vm_writev, mount, …: see --help)",
        lagtrace_agent::seccomp::DENIED.len()
    )?;
    if let Err(e) = &tracefs {
        writeln!(
            out,
            "tracefs: {e} (the host layer's tracepoint programs will say they could not run)"
        )?;
    }
    if skew_us != 0 {
        writeln!(out, "test clock skew: {skew_us} µs")?;
    }
    // Last: a script reading the output has everything once it sees the fingerprint.
    writeln!(out, "fingerprint {fp}")?;
    out.flush()?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        crate::interrupt::on_interrupt(move |_| stop.store(true, Ordering::SeqCst));
    }
    lagtrace_agent::serve(cfg, tls_cfg, listener, stop).context("agent")?;
    Ok(ExitCode::SUCCESS)
}
