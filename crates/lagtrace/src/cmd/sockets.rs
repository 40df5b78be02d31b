//! `lagtrace sockets`: live TCP sockets with their owners' options, or `--record` of a
//! command's (`-- CMD`) or running processes' (`--pid`/`--process`) socket calls.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use lagtrace_netns::NetNs;
use lagtrace_sockets::{
    InspectOptions, Inspection, Mechanism, RecordOptions, Recording, SocketInfo,
};

/// Live socket options and TCP_INFO of processes; record a command's socket calls.
///
/// Inspect (default): every TCP socket (listening and established, IPv4 and IPv6) with its
/// owners, TCP_INFO, delayed-ACK state, and the options only the owner can read
/// (TCP_NODELAY, TCP_CORK, SO_SNDBUF/RCVBUF, TCP_NOTSENT_LOWAT) — read through pidfd_getfd
/// without stopping the process (needs CAP_SYS_PTRACE, or the same uid). nginx owners get
/// a config lens: tcp_nodelay, tcp_nopush, sendfile, keepalive_* with file:line.
///
/// Record: `lagtrace sockets --record -- CMD ARGS...` runs CMD and prints its socket calls
/// strace-style with a summary of the options each socket set, and exits with CMD's
/// status; `--record --pid PID` (or `--process NAME`) watches running processes and their
/// children for `-d` and exits 0 (2 when they cannot be traced). A BPF program on the
/// socket calls records without stopping the program (on fexit trampolines where the
/// kernel allows them, else on the syscall tracepoints); where BPF cannot be loaded,
/// `-- CMD` falls back to seccomp + ptrace (a stop per recorded call). The summary says
/// which was used.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace sockets --process nginx --netns lt-default --json
  lagtrace sockets --record -- wrk -t1 -c2 -d1s http://127.0.0.1:8080/
  lagtrace sockets --record --process nginx -d 10s")]
pub struct Args {
    /// Only sockets whose local or remote port is P
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// Only sockets held by this process id (without --netns, every namespace is searched
    /// when it holds none in this one, and a note says where they were)
    #[arg(long, value_parser = super::process_id)]
    pid: Option<u32>,
    /// Only sockets held by processes with this command name (e.g. nginx; searched like
    /// --pid)
    #[arg(long, value_name = "NAME")]
    process: Option<String>,
    /// Only sockets in these states (established, listen, time-wait, ..., or all);
    /// default: all but time-wait
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    state: Vec<String>,
    /// Look into the network namespace NAME (under /run/netns)
    #[arg(long, value_name = "NAME", conflicts_with = "all_netns")]
    netns: Option<String>,
    /// Look into every network namespace: /run/netns and those of running processes
    #[arg(long)]
    all_netns: bool,
    /// Do not read owner-only options (no pidfd_getfd)
    #[arg(long)]
    no_options: bool,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Record the socket calls of CMD (give it after `--`)
    #[arg(long)]
    record: bool,
    /// With --record: write the call trace to FILE instead of stderr
    #[arg(short = 'o', long, value_name = "FILE", requires = "record")]
    output: Option<PathBuf>,
    /// With --record: do not record close() (sockets' ends are then unknown)
    #[arg(long, requires = "record")]
    no_close: bool,
    /// With --record --pid/--process: how long to watch
    #[arg(short = 'd', long, value_name = "DURATION", default_value = "10s",
          value_parser = super::positive_duration, requires = "record")]
    duration: std::time::Duration,
    /// With --record: bpf (fentry trampolines where they attach, else the syscall
    /// tracepoints), fentry or tracepoint (bpf on those hooks only), ptrace (seccomp stops,
    /// -- CMD only), or auto (bpf, else ptrace)
    #[arg(long, value_name = "HOW", default_value = "auto",
          value_parser = ["auto", "bpf", "fentry", "tracepoint", "raw", "ptrace"], requires = "record")]
    recorder: String,
    /// The command to record
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    cmd: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.record {
        return run_record(args);
    }
    if !args.cmd.is_empty() {
        bail!(
            "unexpected argument {:?}: a command is only taken with --record",
            args.cmd[0]
        );
    }
    let mut states = None;
    if !args.state.is_empty() && !args.state.iter().any(|s| s == "all") {
        let mut v = Vec::new();
        for s in &args.state {
            v.push(lagtrace_sockets::diag::state_number(s).with_context(|| {
                format!("--state {s}: unknown TCP state (established, listen, time-wait, ...)")
            })?);
        }
        states = Some(v);
    } else if args.state.iter().any(|s| s == "all") {
        states = Some((1..=11).collect());
    }
    let netns = NetNs::from_flag(args.netns.as_deref());
    if !netns.exists() {
        bail!(
            "--netns {}: no such network namespace under /run/netns",
            args.netns.as_deref().unwrap_or("")
        );
    }
    let opts = InspectOptions {
        netns,
        all_netns: args.all_netns,
        port: args.port,
        pid: args.pid,
        process: args.process.clone(),
        states,
        read_options: !args.no_options,
        config_lenses: true,
    };
    let mut ins = lagtrace_sockets::inspect(&opts)?;
    let mut show_ns = args.all_netns;
    // A process asked for by pid or name that holds no socket here may live in another
    // namespace (a container, a lab): look in every one rather than say "nothing".
    if ins.sockets.is_empty()
        && (args.pid.is_some() || args.process.is_some())
        && args.netns.is_none()
        && !args.all_netns
    {
        let all = lagtrace_sockets::inspect(&InspectOptions {
            all_netns: true,
            ..opts
        })?;
        if let Some(note) = elsewhere_note(&all) {
            ins = all;
            ins.notes.insert(0, note);
            show_ns = true;
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &lagtrace_model::Envelope::new("sockets", &ins))
            .map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        out.write_all(render_inspection(&ins, show_ns).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the sockets of a search over every namespace were found, when they were found
/// only outside the current one: the note that says so and how to look there directly.
fn elsewhere_note(all: &Inspection) -> Option<String> {
    let mut found: Vec<&str> = all
        .sockets
        .iter()
        .map(|s| s.netns.as_str())
        .filter(|n| *n != "current")
        .collect();
    found.sort_unstable();
    found.dedup();
    if found.is_empty() || all.sockets.iter().any(|s| s.netns == "current") {
        return None;
    }
    Some(format!(
        "none in this network namespace; found in {}: searched every namespace (--netns NAME \
         to look in one, --all-netns to always search them all)",
        found.join(", ")
    ))
}

fn ms(us: Option<u32>) -> String {
    us.map(|v| format!("{:.3}", f64::from(v) / 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn onoff(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "on",
        Some(false) => "off",
        None => "?",
    }
}

fn socket_line(s: &SocketInfo, show_ns: bool) -> String {
    let mut l = String::new();
    if show_ns {
        let _ = write!(l, "[{}] ", s.netns);
    }
    let _ = write!(l, "{:<11} {} ", s.state, s.local);
    if s.state != "LISTEN" {
        let _ = write!(l, "-> {} ", s.remote);
    }
    let owners: Vec<String> = s
        .owners
        .iter()
        .map(|o| format!("{}({},fd={})", o.comm, o.pid, o.fd))
        .collect();
    if owners.is_empty() && s.inode == 0 {
        // No file refers to it: not accepted yet (in a listener's queue), or closed by its
        // process and finished by the kernel.
        l += match s.state.as_str() {
            "SYN-RECV" | "NEW-SYN-RECV" | "ESTABLISHED" | "CLOSE-WAIT" => {
                " no process yet (not accepted: in the listener's queue)"
            }
            _ => " no process (closed, the kernel finishes it)",
        };
    } else if owners.is_empty() {
        l += " owner ? (no process held it when the fds were read: closed or exited since)";
    } else {
        let _ = write!(l, " {}", owners.join(","));
    }
    l += "\n   ";
    if s.state == "LISTEN" {
        let _ = write!(l, " accept queue {}/{}", s.recv_q, s.send_q);
        if let Some(c) = &s.congestion {
            let _ = write!(l, " {c}");
        }
    } else if let Some(t) = &s.tcp_info {
        let _ = write!(
            l,
            " rtt {}/{} ms rto {} ms ato {} ms cwnd {} unacked {} retrans {}/{} lost {}",
            ms(t.rtt_us),
            ms(t.rttvar_us),
            ms(t.rto_us),
            ms(t.ato_us),
            t.snd_cwnd.map(|v| v.to_string()).unwrap_or("-".into()),
            t.unacked.unwrap_or(0),
            t.retrans.unwrap_or(0),
            t.total_retrans.unwrap_or(0),
            t.lost.unwrap_or(0),
        );
        if let Some(c) = &s.congestion {
            let _ = write!(l, " {c}");
        }
        {
            if let (Some(a), Some(b)) = (t.last_data_sent_us, t.last_data_recv_us) {
                let _ = write!(l, " last send/recv {}/{} ms ago", a / 1000, b / 1000);
            }
            if let Some(d) = t.delivery_rate {
                let _ = write!(l, " delivery {:.1} Mbit/s", d as f64 * 8.0 / 1e6);
            }
            if let (Some(b), Some(r), Some(sb)) =
                (t.busy_time_us, t.rwnd_limited_us, t.sndbuf_limited_us)
            {
                let _ = write!(
                    l,
                    " busy {} ms (rwnd-limited {} ms, sndbuf-limited {} ms)",
                    b / 1000,
                    r / 1000,
                    sb / 1000
                );
            }
        }
    }
    if s.state != "LISTEN" {
        // ss's Recv-Q/Send-Q, notsent, mss and counters: what a held segment looks like.
        let v = |x: Option<u32>| x.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let w = |x: Option<u64>| x.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let t = s.tcp_info.clone().unwrap_or_default();
        let _ = write!(
            l,
            "\n    queues: Recv-Q {} Send-Q {} notsent {} mss {} rcvmss {} bytes acked {} \
             received {} segs out {} in {}",
            s.recv_q,
            s.send_q,
            v(t.notsent_bytes),
            v(t.snd_mss),
            v(t.rcv_mss),
            w(t.bytes_acked),
            w(t.bytes_received),
            v(t.segs_out),
            v(t.segs_in),
        );
        if let Some(m) = &s.skmem {
            let _ = write!(
                l,
                " skmem r {} rb {} t {} tb {} w {} d {}",
                m.rmem_alloc,
                m.rcvbuf,
                m.wmem_alloc,
                m.sndbuf,
                m.wmem_queued,
                v(m.drops)
            );
        }
    }
    if let Some(a) = &s.ack
        && s.state != "LISTEN"
    {
        let _ = write!(
            l,
            "\n    ack: {} (quick ACKs left {})",
            if a.pingpong {
                "delayed (pingpong)"
            } else {
                "quick"
            },
            a.quick
        );
    }
    if let Some(o) = &s.options {
        let _ = write!(
            l,
            "\n    options: TCP_NODELAY {} TCP_CORK {} SO_SNDBUF {} SO_RCVBUF {} TCP_NOTSENT_LOWAT {} \
             quick-ACK mode now {}",
            onoff(o.nodelay),
            onoff(o.cork),
            o.sndbuf.map(|v| v.to_string()).unwrap_or("?".into()),
            o.rcvbuf.map(|v| v.to_string()).unwrap_or("?".into()),
            o.notsent_lowat.map(|v| v.to_string()).unwrap_or("?".into()),
            onoff(o.quickack_mode),
        );
    } else if let Some(e) = &s.options_error {
        let _ = write!(l, "\n    options: not read ({e})");
    }
    l.push('\n');
    l
}

fn render_inspection(ins: &Inspection, show_ns: bool) -> String {
    let mut s = String::new();
    if ins.sockets.is_empty() {
        s += "no matching TCP sockets\n";
    }
    for so in &ins.sockets {
        s += &socket_line(so, show_ns);
    }
    if !ins.processes.is_empty() {
        s += "\nprocesses:\n";
        for p in &ins.processes {
            let _ = writeln!(s, "  {}", p.line());
        }
    }
    if !ins.configs.is_empty() {
        s += "\nserver configuration:\n";
        for c in &ins.configs {
            let at = match (&c.file, c.line) {
                (Some(f), Some(l)) => format!("{}:{l}", f.display()),
                _ => "default".into(),
            };
            let _ = writeln!(
                s,
                "  {} (pid {}) {}: {} {}  ({at})",
                c.software, c.pid, c.server, c.directive, c.value
            );
        }
    }
    for n in &ins.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

fn run_record(args: Args) -> anyhow::Result<ExitCode> {
    let attach = args.pid.is_some() || args.process.is_some();
    if args.cmd.is_empty() && !attach {
        bail!(
            "--record needs a command or processes: lagtrace sockets --record -- CMD ARGS..., \
             or --record --pid PID / --process NAME"
        );
    }
    if !args.cmd.is_empty() && attach {
        bail!("--record takes either -- CMD or --pid/--process, not both");
    }
    if let Some(p) = &args.output {
        super::check_output("-o", p)?;
    }
    let live: Box<dyn std::io::Write + Send> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("-o {}", p.display()))?,
        )),
        None => Box::new(std::io::stderr()),
    };
    let opts = RecordOptions {
        live: Some(live),
        trace_close: !args.no_close,
        mechanism: match args.recorder.as_str() {
            "bpf" => Mechanism::Bpf,
            "fentry" => Mechanism::Fentry,
            "tracepoint" => Mechanism::Tracepoint,
            "raw" => Mechanism::Raw,
            "ptrace" => Mechanism::Ptrace,
            _ => Mechanism::Auto,
        },
        stop: None,
        on_attached: None,
    };
    if attach {
        return record_attached(&args, opts);
    }
    // Ctrl-C / Ctrl-\ reach CMD too (same process group): let CMD decide what to do and
    // keep recording until it exits, rather than dying and taking it down (EXITKILL).
    // A handler, not SIG_IGN, so that CMD does not inherit the disposition across exec.
    extern "C" fn keep_recording(_: libc::c_int) {}
    // SAFETY: installing an async-signal-safe no-op handler.
    unsafe {
        libc::signal(
            libc::SIGINT,
            keep_recording as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGQUIT,
            keep_recording as *const () as libc::sighandler_t,
        );
    }
    let rec = lagtrace_sockets::record(&args.cmd, opts)?;
    print_recording(&args, &rec)?;
    Ok(ExitCode::from(rec.exit_status()))
}

/// `--record --pid/--process`: watch running processes for the window (Ctrl-C ends it
/// early, with the report).
fn record_attached(args: &Args, mut opts: RecordOptions) -> anyhow::Result<ExitCode> {
    let pids = match (&args.process, args.pid) {
        (Some(name), _) => {
            let pids = lagtrace_sockets::record::pids_named(name);
            if pids.is_empty() {
                bail!("--process {name}: no running process has that command name");
            }
            pids
        }
        (None, Some(pid)) => vec![pid],
        (None, None) => bail!("--record needs --pid or --process"),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    crate::interrupt::on_interrupt(move |_| flag.store(true, std::sync::atomic::Ordering::SeqCst));
    opts.stop = Some(stop);
    let window = args.duration;
    opts.on_attached = Some(Box::new(move |traced: &[u32]| {
        // Stderr, as the trace: tells the user (and a script) that recording has begun.
        eprintln!(
            "lagtrace: recording the socket calls of pid {} for {window:?} (bpf); Ctrl-C ends it",
            join_pids(traced)
        );
    }));
    let rec = lagtrace_sockets::record_pids(&pids, args.duration, opts)
        .with_context(|| format!("cannot trace process {}", join_pids(&pids)))?;
    print_recording(args, &rec)?;
    Ok(ExitCode::from(rec.exit_status()))
}

fn join_pids(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_recording(args: &Args, rec: &Recording) -> anyhow::Result<()> {
    if args.json {
        // Buffered: stdout is line-buffered, and a recording of many calls is millions of
        // lines (one write(2) each, every one on the syscall tracepoints' slow path).
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        serde_json::to_writer_pretty(
            &mut out,
            &lagtrace_model::Envelope::new("sockets record", rec),
        )
        .map_err(std::io::Error::from)?;
        writeln!(out)?;
        out.flush()?;
    } else {
        eprint!("{}", render_recording(rec));
    }
    Ok(())
}

fn render_recording(r: &Recording) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "--- lagtrace sockets --record ({}): {} sockets ({} TCP), {} calls, {} tasks; {}",
        r.mechanism,
        r.sockets.len(),
        r.tcp_sockets,
        r.events.len(),
        r.tasks,
        match (r.attached.is_empty(), r.exit_code, r.signal) {
            (false, _, _) => format!("attached to pid {}", join_pids(&r.attached)),
            (true, Some(c), _) => format!("exit {c}"),
            (true, None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "no exit status".into(),
        }
    );
    match (&r.fallback, r.hooks.as_deref()) {
        (Some(why), None) => {
            let _ = writeln!(s, "  (seccomp + ptrace: BPF not used: {why})");
        }
        (Some(why), Some(h)) => {
            let _ = writeln!(s, "  hooks: {h} ({why})");
        }
        (None, Some(h)) => {
            let _ = writeln!(s, "  hooks: {h}");
        }
        (None, None) => {}
    }
    if r.lost_events > 0 {
        let _ = writeln!(
            s,
            "  LOST: {} calls or process events had no room in the recorder's buffers; \
             the trace is incomplete",
            r.lost_events
        );
    }
    for o in &r.option_summary {
        let _ = writeln!(
            s,
            "  {} {}={} on {} socket{}",
            o.level,
            o.option,
            o.value,
            o.sockets,
            if o.sockets == 1 { "" } else { "s" }
        );
    }
    let list = |v: &[usize]| {
        let fds: Vec<String> = v
            .iter()
            .take(10)
            .map(|&i| {
                let so = &r.sockets[i];
                format!("pid {} fd {}", so.pid, so.fd)
            })
            .collect();
        format!(
            "{}{}",
            fds.join(", "),
            if v.len() > 10 { ", ..." } else { "" }
        )
    };
    if r.tcp_sockets > 0 {
        let _ = writeln!(
            s,
            "  TCP sockets that never set TCP_NODELAY: {}/{}{}",
            r.never_nodelay.len(),
            r.tcp_sockets,
            if r.never_nodelay.is_empty() {
                String::new()
            } else {
                format!(" ({})", list(&r.never_nodelay))
            }
        );
        let _ = writeln!(
            s,
            "  TCP sockets that never set TCP_QUICKACK: {}/{}{}",
            r.never_quickack.len(),
            r.tcp_sockets,
            if r.never_quickack.is_empty() {
                String::new()
            } else {
                format!(" ({})", list(&r.never_quickack))
            }
        );
    }
    s
}
