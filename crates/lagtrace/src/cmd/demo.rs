//! `lagtrace demo`: the reference case end to end. Until `diagnose` exists: lab up, a short
//! measurement of both servers side by side, lab fix, measure again, lab down.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use lagtrace_lab::probe_client::{Response, get_sequence};
use lagtrace_lab::{Lab, LabOptions, ServerKind};

/// Show the reference case on this machine: real nginx with `tcp_nodelay off` stalls each
/// keep-alive response ~40 ms (Nagle meets delayed ACK); `tcp_nodelay on` fixes it.
///
/// Needs root. Leaves nothing behind, also on Ctrl-C.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sequential keep-alive requests per measurement
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub requests: u32,
    /// Lab name to use
    #[arg(long, default_value = "demo")]
    pub name: String,
}

const TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let name = args.name.clone();
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                // Second Ctrl-C: tear down now and leave.
                let _ = Lab::down(&name);
                std::process::exit(130);
            }
            eprintln!("lagtrace demo: interrupted, tearing the lab down");
        })
        .context("installing the Ctrl-C handler")?;
    }
    let check = || -> anyhow::Result<()> {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted; the lab was removed");
        }
        Ok(())
    };

    println!(
        "lagtrace demo: nginx with `tcp_nodelay off` meets the client's delayed ACK (the reference case)"
    );
    let kind = if std::path::Path::new(lagtrace_lab::NGINX).exists() {
        ServerKind::Nginx
    } else {
        println!(
            "  nginx is not installed (apt-get install nginx-light): using the built-in server instead"
        );
        ServerKind::BuiltinProcess(std::env::current_exe()?)
    };
    let lab = Lab::up(&LabOptions::new(&args.name).server(kind))?;
    let st = lab.state();
    let what = st
        .servers
        .first()
        .map(|s| s.kind.clone())
        .unwrap_or_default();
    println!(
        "1. lab up: server host in namespace {} at {}, this host at {} ({}); {what} good on :80, latency on :8080",
        st.netns, st.server_addr, st.client_addr, st.client_iface
    );
    check()?;

    let n = args.requests as usize;
    println!("2. {n} sequential GETs on one keep-alive connection to each server:");
    println!("     {:<22} {:>10} {:>10}", "server", "p50", "max");
    let good = measure(lab.good_addr(), n)?;
    row("good    :80", &good);
    check()?;
    let slow = measure(lab.latency_addr(), n)?;
    row("latency :8080", &slow);
    check()?;
    let slow_p50 = p50(&slow);
    println!(
        "   the latency server takes {:.1} ms per response vs {:.2} ms: Nagle holds the body until the client's delayed ACK",
        ms(slow_p50),
        ms(p50(&good))
    );

    lab.fix().context("lab fix")?;
    println!("3. lab fix: latency server set to `tcp_nodelay on`, nginx reloaded");
    let fixed = measure(lab.latency_addr(), n)?;
    row("latency :8080 (fixed)", &fixed);
    check()?;
    println!("   p50 {:.1} ms -> {:.2} ms", ms(slow_p50), ms(p50(&fixed)));
    drop(lab);
    println!("4. lab down: servers, namespace and veth removed");
    println!("   (`lagtrace diagnose`, which finds and explains this by itself, is not built yet)");
    Ok(ExitCode::SUCCESS)
}

fn measure(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Duration>> {
    let r: Vec<Response> =
        get_sequence(addr, n, TIMEOUT).with_context(|| format!("GET http://{addr}/"))?;
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

fn row(label: &str, d: &[Duration]) {
    let max = d.iter().max().copied().unwrap_or_default();
    println!(
        "     {label:<22} {:>7.2} ms {:>7.2} ms",
        ms(p50(d)),
        ms(max)
    );
}
