//! `lagtrace demo`: the reference case end to end — lab up, a quick look, `diagnose` the
//! latency server, `lab fix`, `diagnose --verify`, lab down.

/// `println!` that returns the write error (a closed pipe, as under `| head`) instead of
/// panicking; `report_error` turns a broken pipe into a silent exit 0.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($t)*)?
    }};
}

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lagtrace_diagnose::{Diagnosis, Stance, Verify};
use lagtrace_lab::probe_client::{Response, get_sequence_until};
use lagtrace_lab::{Lab, LabOptions, ServerKind};

/// Show the reference case on this machine: real nginx with `tcp_nodelay off` stalls each
/// keep-alive response ~40 ms (Nagle meets delayed ACK). `lagtrace diagnose` finds it, names
/// the config line; `lab fix` sets `tcp_nodelay on`; `diagnose --verify` proves the fix.
///
/// Needs root. Takes about 20 s. Leaves nothing behind, also on Ctrl-C.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace demo
  lagtrace demo -d 10s --report demo.html")]
pub struct Args {
    /// Sequential keep-alive requests in the quick look before the diagnosis
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub requests: u32,
    /// Load budget of each diagnosis (c=1 and c=32 together)
    #[arg(short = 'd', long, default_value = "6s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Also write the HTML report of the verified run to FILE
    #[arg(long, value_name = "FILE")]
    pub report: Option<std::path::PathBuf>,
    /// Lab name to use
    #[arg(long, default_value = "demo")]
    pub name: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    lagtrace_load::parse_duration(s).map_err(|e| format!("{e:#}"))
}

const TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    install_ctrlc(stop.clone(), args.name.clone());
    let check = || -> anyhow::Result<()> {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted; the lab was removed");
        }
        Ok(())
    };

    outln!(
        "lagtrace demo: nginx with `tcp_nodelay off` meets the client's delayed ACK (the reference case)"
    );
    let kind = server_kind()?;
    // The guard tears the lab down on every way out of this function, errors included.
    let lab = Lab::up(&LabOptions::new(&args.name).server(kind))?;
    let st = lab.state();
    let what = st
        .servers
        .first()
        .map(|s| s.kind.clone())
        .unwrap_or_default();
    outln!(
        "1. lab up: server host in namespace {} at {}, this host at {} ({}); {what} good on :80, latency on :8080",
        st.netns,
        st.server_addr,
        st.client_addr,
        st.client_iface
    );
    check()?;

    let n = args.requests as usize;
    outln!("2. a quick look: {n} sequential GETs on one keep-alive connection to each server");
    outln!("     {:<22} {:>10} {:>10}", "server", "p50", "max");
    let good = measure(lab.good_addr(), n, &stop)?;
    row("good    :80", &good)?;
    check()?;
    let slow = measure(lab.latency_addr(), n, &stop)?;
    row("latency :8080", &slow)?;
    check()?;
    outln!(
        "   the same nginx page, {:.0}x slower: why?",
        ms(p50(&slow)) / ms(p50(&good)).max(0.001)
    );

    let url = lab.latency_url();
    outln!("3. lagtrace diagnose {url}");
    let before = diagnose(&url, args.duration, None)?;
    check()?;
    narrate(&before)?;

    match lab.fix().context("lab fix")? {
        Some(e) => outln!("4. lab fix: {}, nginx reloaded", e.describe()),
        None => outln!("4. lab fix: the latency server restarted with TCP_NODELAY on"),
    }
    check()?;

    outln!("5. lagtrace diagnose {url} --verify");
    let after = diagnose(&url, args.duration, Some(&before))?;
    check()?;
    narrate(&after)?;
    if let Some(v) = &after.verify {
        verify_table(v)?;
    }
    if let Some(p) = &args.report {
        std::fs::write(p, lagtrace_report::html(&after))
            .with_context(|| format!("writing {}", p.display()))?;
        outln!("   report: {}", p.display());
    }
    drop(lab);
    outln!(
        "6. lab down: servers, namespace and veth removed ({:.0} s in all)",
        t0.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// First Ctrl-C: stop the running step, and the guard tears the lab down; second: now.
/// (The running diagnosis has its own hook; the process exits 130 after the second.)
fn install_ctrlc(stop: Arc<AtomicBool>, name: String) {
    crate::interrupt::on_interrupt(move |press| {
        if press >= 2 {
            // Second Ctrl-C: tear down now and leave.
            let _ = Lab::down(&name);
            return;
        }
        stop.store(true, Ordering::SeqCst);
        eprintln!("lagtrace demo: interrupted, tearing the lab down");
    });
}

/// nginx when installed (the reference case), else this binary's built-in server.
fn server_kind() -> anyhow::Result<ServerKind> {
    if std::path::Path::new(lagtrace_lab::NGINX).exists() {
        return Ok(ServerKind::Nginx);
    }
    outln!(
        "  nginx is not installed (apt-get install nginx-light): using the built-in server instead"
    );
    Ok(ServerKind::BuiltinProcess(std::env::current_exe()?))
}

/// The before → after rows of the verifying run (c=1's rate left out).
fn verify_table(v: &Verify) -> anyhow::Result<()> {
    outln!(
        "     {:<6} {:<6} {:>10} {:>10}",
        "run",
        "metric",
        "before",
        "after"
    );
    for r in v
        .rows
        .iter()
        .filter(|r| r.metric != "req/s" || r.run != "c=1")
    {
        let (b, a) = if r.metric == "req/s" {
            (format!("{:.0}", r.before), format!("{:.0}", r.after))
        } else {
            (
                lagtrace_model::Micros(r.before as u64).to_string(),
                lagtrace_model::Micros(r.after as u64).to_string(),
            )
        };
        outln!(
            "     {:<6} {:<6} {:>10} {:>10}  {:.0}x better",
            r.run,
            r.metric,
            b,
            a,
            r.improvement
        );
    }
    Ok(())
}

fn diagnose(
    url: &str,
    duration: Duration,
    baseline: Option<&Diagnosis>,
) -> anyhow::Result<Diagnosis> {
    let args = super::diagnose::Args {
        url: Some(url.into()),
        connections: 32,
        duration: Some(duration),
        timeout: Duration::from_secs(2),
        insecure: false,
        headers: Vec::new(),
        json: false,
        report: None,
        save: None,
        baseline: None,
        verify: false,
        server_pid: None,
        no_hops: false,
        agent: Default::default(),
        passive: Default::default(),
        quiet: false,
    };
    let mut d = super::diagnose::diagnose(&args)?;
    if let Some(b) = baseline {
        d.verify = Some(d.compare_with(b, "step 3"));
    }
    Ok(d)
}

/// A few lines: verdict, cost, the strongest evidence, the first fix.
fn narrate(d: &Diagnosis) -> std::io::Result<()> {
    let v = &d.verdict;
    outln!(
        "   verdict: {} (confidence {})",
        v.cause,
        v.confidence.name()
    );
    outln!("   cost: {}", v.cost.text);
    for e in d
        .evidence
        .iter()
        .filter(|e| e.stance == Stance::Supports)
        .take(3)
    {
        outln!("   + [{}] {}", e.layer.name(), clip(&e.text, 150));
    }
    if let Some(f) = v.fix.first() {
        let loc = f
            .location
            .as_ref()
            .map(|l| format!("{l}: "))
            .unwrap_or_default();
        outln!("   fix: {loc}{}", f.change);
    }
    Ok(())
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n).collect();
        format!("{t}…")
    }
}

fn measure(addr: SocketAddr, n: usize, stop: &AtomicBool) -> anyhow::Result<Vec<Duration>> {
    let r: Vec<Response> = get_sequence_until(addr, n, TIMEOUT, stop)
        .with_context(|| format!("GET http://{addr}/"))?;
    if r.len() < n {
        bail!("interrupted; the lab was removed");
    }
    if let Some(bad) = r.iter().find(|r| r.status != 200) {
        bail!("http://{addr}/ answered {}", bad.status);
    }
    Ok(r.into_iter().map(|r| r.elapsed).collect())
}

fn p50(d: &[Duration]) -> Duration {
    let mut v = d.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(label: &str, d: &[Duration]) -> std::io::Result<()> {
    let max = d.iter().max().copied().unwrap_or_default();
    outln!(
        "     {label:<22} {:>7.2} ms {:>7.2} ms",
        ms(p50(d)),
        ms(max)
    );
    Ok(())
}
