//! `lagtrace diagnose URL`: every layer against URL, one verdict with evidence and fix.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use lagtrace_diagnose::{DiagnoseOptions, Diagnosis, Step};
use lagtrace_model::Cause;

/// Run every layer against URL — path (SYN RTT idle and under load), application (c=1 and
/// c=N), packets (captured during the load) and sockets (the server's options and config) —
/// and print the verdict, the evidence, and the fix.
///
/// The client side is lagtrace's own load generator; it behaves like wrk and browsers:
/// TCP_NODELAY on, delayed ACK on. Needs root for SYN probes (CAP_NET_RAW), the capture and
/// the server's socket options (CAP_SYS_PTRACE); without them those layers say "unavailable"
/// and the verdict comes from the rest.
///
/// Exit status: 0 healthy, 1 a cause was found (or unreachable), 2 the diagnosis could not run.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Every complete run is also saved to ~/.local/state/lagtrace/ (per host:port) so that
`--verify`, after a fix, prints before/after against it; an interrupted (partial) run is not,
and is refused as a --baseline.
The client is lagtrace's own load generator: TCP_NODELAY on, delayed ACK on, like wrk and
browsers. Root gives every layer: SYN probes and the capture need CAP_NET_RAW, the server's
namespace and socket options CAP_SYS_ADMIN / CAP_SYS_PTRACE; without them those layers say
\"unavailable\" and the verdict comes from the rest.
The host layer reads the server host's kernel (listen-queue overflows, the cgroup's CPU
throttling timeline, run-queue delay, counters, qdiscs) during the c=N run, for the process
holding the listener on the target port (or --server-pid PID) when the server is on this
machine; a server elsewhere leaves it \"skipped\".

Exit status: 0 healthy, 1 a cause was found (or unreachable), 2 the diagnosis could not run.

Passive: `--passive --netns NS --port PORT` (or `-i IFACE`, or a URL whose host:port
selects the server) watches the real clients' connections for -d (default 30s) and sends no
request at all: the app layer is what the clients experienced, the sockets and host layers
are read as in an active run. `--pcap FILE --port PORT` does the same from a saved capture
(packets only). Ctrl-C gives the verdict so far, marked partial.

Examples:
  lagtrace diagnose http://10.0.0.2:8080/ --report report.html
  lagtrace diagnose --passive --netns lt-default --port 8080 -d 60s
  lagtrace diagnose --pcap nginx.pcap --port 8080")]
pub struct Args {
    /// Target URL, http://host[:port]/path (with --passive: selects the server's address
    /// and port)
    #[arg(required_unless_present_any = ["passive", "pcap"])]
    pub url: Option<String>,
    /// Connections of the concurrent run
    #[arg(short = 'c', long = "connections", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub connections: u32,
    /// Load budget for c=1 and c=N together (30% / 70%), e.g. 7s, 3s, 1m [default: 7s];
    /// with --passive the window watched [default: 30s]
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Request timeout of the load
    #[arg(long, default_value = "2s", value_parser = super::positive_duration)]
    pub timeout: Duration,
    /// https: accept any certificate (self-signed, wrong name)
    #[arg(long)]
    pub insecure: bool,
    /// Add a request header to the load, "Name: value" (repeatable), as `lagtrace load -H`:
    /// e.g. "Accept-Encoding: gzip" to have the server compress as browsers ask it to
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub headers: Vec<String>,
    /// Print the diagnosis as JSON (stable schema) instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report to FILE
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Also save this run's JSON to FILE (a baseline for --baseline)
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Compare with a previous run saved in FILE (implies --verify)
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Compare with the previous run against the same host:port (before/after p50, p99, req/s)
    #[arg(long)]
    pub verify: bool,
    /// The server's process for the host layer (its cgroup CPU throttling, run-queue delay,
    /// listen queues, namespace counters). Default: the process holding the listener on the
    /// target port, found when the target address is this namespace's (loopback) or a
    /// namespace's under /run/netns; otherwise the host layer is skipped
    #[arg(long, value_name = "PID", value_parser = super::process_id)]
    pub server_pid: Option<u32>,
    /// Do not follow the request behind the server. By default the connections the server's
    /// processes open during the run (to an application server, a database, a cache) are
    /// found from their sockets, captured in the server's namespace (loopback included) and
    /// judged with the same rules: a cause on such a hop is named there (`verdict.hop`), and
    /// each request's wait on it is told from the server's own time. `--passive` follows them
    /// over its window too; `--pcap` finds them in the file when it holds them
    #[arg(long)]
    pub no_hops: bool,
    /// The server-side layers (capture, sockets, host) from `lagtrace agent` on the server's
    /// host instead of this machine
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Passive mode: real clients' traffic instead of lagtrace's own load
    #[command(flatten)]
    pub passive: PassiveArgs,
    /// No progress lines on stderr
    #[arg(short, long)]
    pub quiet: bool,
}

/// `--passive` / `--pcap FILE` and where to watch.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PassiveArgs {
    /// Watch the real clients' connections to the server (no request is sent)
    #[arg(long, conflicts_with_all = ["pcap", "agent", "verify", "baseline"])]
    pub passive: bool,
    /// --passive: the server's network namespace (under /run/netns)
    #[arg(long, value_name = "NS", requires = "passive")]
    pub netns: Option<String>,
    /// --passive: the interface to capture on (default: all of the namespace's)
    #[arg(
        short = 'i',
        long = "iface",
        value_name = "IFACE",
        requires = "passive"
    )]
    pub iface: Option<String>,
    /// --passive / --pcap: the server's TCP port (default: the URL's)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Diagnose a saved capture (pcap or pcapng) of the clients' traffic to --port
    #[arg(long, value_name = "FILE", requires = "port",
          conflicts_with_all = ["url", "agent", "verify", "baseline"])]
    pub pcap: Option<PathBuf>,
}

/// `--agent ADDR:PORT` and how to trust it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentArgs {
    /// The server host's `lagtrace agent`: its capture, sockets and host layers replace the
    /// local server-side ones (no namespace here is entered)
    #[arg(
        long = "agent",
        value_name = "ADDR:PORT",
        requires = "agent_fingerprint"
    )]
    pub agent: Option<std::net::SocketAddr>,
    /// The agent's certificate fingerprint as it printed it at start (sha256:HEX)
    #[arg(long, value_name = "SHA256", requires = "agent")]
    pub agent_fingerprint: Option<String>,
    /// File holding the agent's token (default: $LAGTRACE_AGENT_TOKEN; never a flag)
    #[arg(long, value_name = "FILE", requires = "agent")]
    pub agent_token_file: Option<PathBuf>,
}

/// The agent client of `--agent`, its flags checked before any traffic.
fn agent_client(
    a: &AgentArgs,
) -> anyhow::Result<Option<Arc<dyn lagtrace_diagnose::remote::RemoteServer>>> {
    let (Some(addr), Some(fp)) = (a.agent, a.agent_fingerprint.as_deref()) else {
        return Ok(None);
    };
    let pin = lagtrace_agent::tls::parse_fingerprint(fp)
        .map_err(|e| anyhow::anyhow!("--agent-fingerprint {e}"))?;
    let token = lagtrace_agent::auth::Token::load(a.agent_token_file.as_deref())
        .map_err(|e| anyhow::anyhow!("--agent: {e}"))?;
    let c = lagtrace_agent::AgentClient::new(addr, pin, token)
        .map_err(|e| anyhow::anyhow!("--agent: {e}"))?;
    // Asked for, the agent must answer before any traffic: an agent down, refusing the
    // token or showing another certificate leaves the server side unseen, and a verdict
    // over the client's side alone is not what was asked (run without --agent for that).
    c.clock_offset().map_err(|e| {
        anyhow::anyhow!(
            "--agent {addr}: {e} (no request was sent; without --agent, diagnose looks from \
             this side only)"
        )
    })?;
    Ok(Some(Arc::new(c)))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    lagtrace_load::parse_duration(s).map_err(|e| format!("{e:#}"))
}

/// Where the last run against host:port is kept.
fn state_file(host: &str, port: u16) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    let safe: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(
        base.join("lagtrace")
            .join(format!("diagnose-{safe}-{port}.json")),
    )
}

/// How many targets' last runs the state directory keeps (the most recently written).
pub const KEEP_STATE: usize = 64;

/// Bounds the state directory: removes all but the `keep` most recent `diagnose-*.json`
/// files (one per target) in `dir`; other files are left alone. Returns how many went.
fn prune_state(dir: &Path, keep: usize) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut runs: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("diagnose-") && n.ends_with(".json")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    runs.sort_by_key(|r| std::cmp::Reverse(r.0));
    runs.iter()
        .skip(keep)
        .filter(|(_, p)| std::fs::remove_file(p).is_ok())
        .count()
}

fn load_baseline(p: &Path) -> anyhow::Result<Diagnosis> {
    let s = std::fs::read_to_string(p).with_context(|| format!("baseline {}", p.display()))?;
    let d: Diagnosis = serde_json::from_str(&s)
        .with_context(|| format!("baseline {}: not a saved diagnosis", p.display()))?;
    // A run cut short measured part of the layers and claimed no cause: "before" would
    // read `partial`, and its figures cover only what ran.
    if d.verdict.cause == Cause::Partial {
        anyhow::bail!(
            "baseline {}: that run was interrupted (verdict partial) and is no baseline; run \
             diagnose to the end before the fix",
            p.display()
        );
    }
    Ok(d)
}

fn save(p: &Path, d: &Diagnosis) -> anyhow::Result<()> {
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(p, lagtrace_report::json(d)).with_context(|| format!("writing {}", p.display()))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let passive = args.passive.passive || args.passive.pcap.is_some();
    let last = match (&args.url, passive) {
        (Some(url), false) => {
            let (target, _) = lagtrace_diagnose::run::parse_target(url)?;
            state_file(&target.host, target.port)
        }
        _ => None,
    };
    let target_name = args.url.clone().unwrap_or_default();
    // The baseline is read before this run (which replaces the saved "last" run).
    let baseline = match (&args.baseline, args.verify) {
        (Some(p), _) => Some((load_baseline(p)?, p.display().to_string())),
        (None, true) => {
            let p = last
                .as_ref()
                .context("--verify: no HOME to find the previous run; use --baseline FILE")?;
            let d = load_baseline(p).with_context(|| {
                if p.exists() {
                    "--verify: the previous run".to_string()
                } else {
                    format!(
                        "--verify: no previous run against {target_name} (run diagnose once \
                         before the fix, or give --baseline FILE)"
                    )
                }
            })?;
            Some((d, p.display().to_string()))
        }
        (None, false) => None,
    };
    // Output files are checked before any traffic; written after the verdict is printed.
    if let Some(p) = &args.report {
        super::check_output("--report", p)?;
    }
    if let Some(p) = &args.save {
        super::check_output("--save", p)?;
    }
    let d = if passive {
        diagnose_passive(&args)?
    } else {
        diagnose(&args)?
    };
    let d = match baseline {
        Some((b, name)) => {
            let mut d = d;
            d.verify = Some(d.compare_with(&b, &name));
            d
        }
        None => d,
    };
    // An interrupted run is no baseline: the previous complete run stays the one --verify
    // compares with.
    let last = match last {
        Some(_) if d.verdict.cause == Cause::Partial => {
            if !args.quiet {
                eprintln!("interrupted: this run is not kept as the --verify baseline");
            }
            None
        }
        last => last,
    };
    if let Some(p) = &last {
        match save(p, &d) {
            Err(e) if !args.quiet => {
                eprintln!("lagtrace diagnose: could not keep this run for --verify: {e:#}")
            }
            Err(_) => {}
            Ok(()) => {
                if let Some(dir) = p.parent() {
                    prune_state(dir, KEEP_STATE);
                }
            }
        }
    }
    let out = if args.json {
        lagtrace_report::json(&d) + "\n"
    } else {
        lagtrace_report::text(&d)
    };
    std::io::stdout().write_all(out.as_bytes())?;
    // The verdict is out; a file that cannot be written now is one error line, exit 2.
    if let Some(p) = &args.save {
        save(p, &d)?;
    }
    if let Some(p) = &args.report {
        std::fs::write(p, lagtrace_report::html(&d))
            .with_context(|| format!("writing the report {}", p.display()))?;
        if !args.quiet {
            eprintln!("report written to {}", p.display());
        }
    }
    Ok(if d.verdict.cause == Cause::Healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_FINDING)
    })
}

static STOP: AtomicBool = AtomicBool::new(false);

/// The progress printer: one line per step on stderr; live counts replace each other on a
/// terminal.
fn printer(quiet: bool) -> impl Fn(Step) {
    let tty = std::io::stderr().is_terminal();
    move |s: Step| {
        if quiet {
            return;
        }
        match s {
            Step::Start(t) if tty => eprintln!("  … {t}"),
            Step::Start(_) => {}
            Step::Done(t) => eprintln!("{}  ✓ {t}", if tty { "\r\x1b[K" } else { "" }),
            // Skipped, unavailable or failed: never a check mark.
            Step::NotRun(t) => eprintln!("{}  ✗ {t}", if tty { "\r\x1b[K" } else { "" }),
            Step::Progress(t) if tty => eprint!("\r\x1b[K  … {t}"),
            Step::Progress(t) => eprintln!("  … {t}"),
        }
    }
}

/// The Ctrl-C flag of one diagnosis: set by the process's interrupt hook, watched by a
/// thread until `done`.
fn stop_flag() -> (
    Arc<AtomicBool>,
    Arc<AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    // Once per process (demo runs several diagnoses).
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| crate::interrupt::on_interrupt(|_| STOP.store(true, Ordering::SeqCst)));
    let watcher_stop = stop.clone();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if STOP.load(Ordering::Relaxed) {
                    watcher_stop.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    (stop, done, watcher)
}

/// `--passive` / `--pcap`: the diagnosis from the clients' traffic, no request sent.
fn diagnose_passive(args: &Args) -> anyhow::Result<Diagnosis> {
    use lagtrace_diagnose::passive::{DEFAULT_WINDOW, PassiveOptions, Source};
    let p = &args.passive;
    let from_url = match &args.url {
        Some(u) => Some(lagtrace_diagnose::passive::from_url(u)?),
        None => None,
    };
    let port = p
        .port
        .or(from_url.as_ref().map(|(sa, _)| sa.port()))
        .context("--passive needs --port PORT or a URL naming the server's port")?;
    if p.passive && p.netns.is_none() && p.iface.is_none() && from_url.is_none() {
        anyhow::bail!("--passive needs where to watch: --netns NS, -i IFACE, or a URL");
    }
    let source = match &p.pcap {
        Some(f) => Source::File(f.clone()),
        None => Source::Live {
            netns: p.netns.clone(),
            iface: p.iface.clone(),
            window: args.duration.unwrap_or(DEFAULT_WINDOW),
        },
    };
    let (stop, done, watcher) = stop_flag();
    let mut o = PassiveOptions {
        source,
        port,
        addr: from_url.as_ref().map(|(sa, _)| sa.ip()),
        url: from_url.map(|(_, u)| u),
        stop,
        server_pid: args.server_pid,
        no_hops: args.no_hops,
    };
    // A URL's host in a namespace: watch there.
    if let (Source::Live { netns, .. }, Some(a)) = (&mut o.source, o.addr)
        && netns.is_none()
        && let lagtrace_diagnose::ServerLocation::Namespace(n) = lagtrace_diagnose::run::locate(a)
    {
        *netns = Some(n);
    }
    let r = lagtrace_diagnose::passive::run(&o, &printer(args.quiet));
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    Ok(r?)
}

/// Runs the diagnosis with progress lines on stderr (shared with `demo`).
pub fn diagnose(args: &Args) -> anyhow::Result<Diagnosis> {
    let url = args.url.as_deref().context("a URL is needed")?;
    let remote = agent_client(&args.agent)?;
    let (stop, done, watcher) = stop_flag();
    let mut o = DiagnoseOptions::new(url);
    o.concurrency = args.connections;
    o.duration = args
        .duration
        .unwrap_or(lagtrace_diagnose::run::DEFAULT_DURATION);
    o.timeout = args.timeout;
    o.insecure = args.insecure;
    o.headers = args.headers.clone();
    o.server_pid = args.server_pid;
    o.no_hops = args.no_hops;
    o.remote = remote;
    o.stop = stop;
    let r = lagtrace_diagnose::run(&o, &printer(args.quiet));
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    Ok(r?)
}

#[cfg(test)]
mod tests {
    use super::prune_state;
    use std::time::{Duration, SystemTime};

    #[test]
    fn the_state_directory_keeps_the_most_recent_runs_only() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = SystemTime::now() - Duration::from_secs(3600);
        for i in 0..10u64 {
            let p = dir.path().join(format!("diagnose-10.0.0.{i}-80.json"));
            let f = std::fs::File::create(&p).unwrap();
            f.set_modified(t0 + Duration::from_secs(i)).unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "kept").unwrap();
        assert_eq!(prune_state(dir.path(), 4), 6);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "diagnose-10.0.0.6-80.json",
                "diagnose-10.0.0.7-80.json",
                "diagnose-10.0.0.8-80.json",
                "diagnose-10.0.0.9-80.json",
                "notes.txt"
            ]
        );
        assert_eq!(prune_state(dir.path(), 4), 0);
    }
}
