//! `lagtrace analyze`: TCP streams, transactions, flow graph and latency findings of a pcap.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use lagtrace_packet::analysis::flags_str;
use lagtrace_packet::{Analysis, AnalyzeOptions, analyze_file};

/// Analyze a pcap/pcapng file: streams, transactions, findings.
#[derive(Debug, clap::Args)]
// -V is the peer's verbose flag here (the version is `lagtrace --version`).
#[command(disable_version_flag = true)]
#[command(after_help = "\
Default output: a table of TCP streams (like `tshark -q -z conv,tcp`), then the findings
summary (nagle-delayed-ack, nagle-stall, delayed-ack, retransmission, syn-retransmit,
zero-window, window-full, tcp-cork, slow-server) with the transactions each one affects.

Exit status: 0 no finding; 1 findings; 2 could not run.

Coming from tcpdump/tshark: -r FILE and -n mean the same here, -q and -2 change nothing; -z,
-Y, -T, -V and the other tshark flags are refused with one line saying what to use (the list:
docs/peer-flags.md).

Examples:
  lagtrace analyze case.pcap
  lagtrace analyze case.pcap --stream 1 --flow
  lagtrace analyze -n -r case.pcap --json")]
pub struct Args {
    /// Capture file (pcap or pcapng).
    pub file: PathBuf,
    /// Stream index (as Wireshark's tcp.stream) for --flow.
    #[arg(long, requires = "flow")]
    pub stream: Option<u32>,
    /// Print the stream given by --stream as a text flow graph.
    #[arg(long, requires = "stream")]
    pub flow: bool,
    /// Print the payload of stream N like Wireshark's Follow TCP Stream.
    #[arg(long, value_name = "N")]
    pub follow: Option<u32>,
    /// Print everything as JSON.
    #[arg(long)]
    pub json: bool,
    /// List every finding, not only the summary.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Write the capture back as pcapng with a comment on every packet a finding involves.
    #[arg(long, value_name = "OUT.pcapng")]
    pub annotate: Option<PathBuf>,
    /// The capture file follows (tcpdump/tshark -r FILE): `-r FILE` is the same as FILE.
    #[arg(short = 'r')]
    pub read: bool,
    /// Do not resolve addresses (tcpdump -n, -nn): always the case here.
    #[arg(short = 'n', action = clap::ArgAction::Count)]
    pub numeric: u8,
    /// Print version (-V is tshark's packet details here)
    #[arg(long, action = clap::ArgAction::Version)]
    version: (),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.flow && args.follow.is_some() {
        bail!("--flow and --follow are separate views; give one of them");
    }
    let keep = if args.flow { args.stream } else { args.follow };
    let opts = AnalyzeOptions {
        keep_stream: keep,
        ..AnalyzeOptions::default()
    };
    let an = analyze_file(&args.file, &opts)?;
    // Cut before its first complete record (a header cut short): nothing to analyze is an
    // input error, not an empty capture. Cut later, what came before is analyzed (warning).
    if an.frames == 0
        && let Some(w) = an.warnings.iter().find(|w| w.contains("truncated"))
    {
        bail!("{}: {w}: no complete packet record", args.file.display());
    }
    if let Some(k) = keep
        && k as usize >= an.streams.len()
    {
        bail!(
            "stream {k} does not exist: {} has {} TCP streams (0..{})",
            args.file.display(),
            an.streams.len(),
            an.streams.len().saturating_sub(1)
        );
    }
    if let Some(path) = &args.annotate {
        annotate(&args.file, path, &an)?;
    }
    let mut out = String::new();
    if args.json {
        let v = serde_json::to_string_pretty(&lagtrace_model::Envelope::new("analyze", &an))
            .context("serialize")?;
        out.push_str(&v);
        out.push('\n');
    } else if args.flow {
        render_flow(&mut out, &an, args.stream.unwrap_or(0));
    } else if let Some(n) = args.follow {
        render_follow(&mut out, &an, n);
    } else {
        render_table(&mut out, &an);
        render_summary(&mut out, &an, args.verbose);
    }
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    lock.write_all(out.as_bytes()).context("write output")?;
    lock.flush().context("write output")?;
    if !args.json {
        for w in &an.warnings {
            eprintln!("lagtrace analyze: warning: {w}");
        }
    }
    Ok(if an.summary.iter().any(|s| s.findings > 0) {
        ExitCode::from(super::EXIT_FINDING)
    } else {
        ExitCode::SUCCESS
    })
}

fn human_bytes(b: u64) -> String {
    if b < 10_000 {
        format!("{b} bytes")
    } else if b < 10_000_000 {
        format!("{} kB", b / 1000)
    } else {
        format!("{} MB", b / 1_000_000)
    }
}

fn render_table(out: &mut String, an: &Analysis) {
    let _ = writeln!(
        out,
        "TCP streams: {} ({} frames, {} TCP, {:.6} s)",
        an.streams.len(),
        an.frames,
        an.tcp_frames,
        an.duration_us as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "{:>6}  {:<45} {:<45} {:>8} {:>11} {:>8} {:>11} {:>8} {:>11} {:>12} {:>10}",
        "stream",
        "A",
        "B",
        "A->B fr",
        "bytes",
        "B->A fr",
        "bytes",
        "frames",
        "bytes",
        "rel start",
        "duration"
    );
    for s in &an.streams {
        let _ = writeln!(
            out,
            "{:>6}  {:<45} {:<45} {:>8} {:>11} {:>8} {:>11} {:>8} {:>11} {:>12.6} {:>10.4}",
            s.stream,
            s.a.to_string(),
            s.b.to_string(),
            s.frames_ab,
            human_bytes(s.bytes_ab),
            s.frames_ba,
            human_bytes(s.bytes_ba),
            s.frames_ab + s.frames_ba,
            human_bytes(s.bytes_ab + s.bytes_ba),
            s.start_us as f64 / 1e6,
            s.duration_us as f64 / 1e6,
        );
    }
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn render_summary(out: &mut String, an: &Analysis, verbose: bool) {
    let _ = writeln!(out);
    let ts = &an.transaction_stats;
    let _ = writeln!(
        out,
        "transactions: {} ({} complete): request to last response byte median {}, p99 {}, max {}; server time median {}",
        an.transactions_total,
        ts.complete,
        ms(ts.median_us),
        ms(ts.p99_us),
        ms(ts.max_us),
        ms(ts.median_server_us)
    );
    if an.summary.is_empty() {
        let _ = writeln!(out, "findings: none");
        return;
    }
    let _ = writeln!(
        out,
        "{:<18} {:>8} {:>14} {:>7} {:>10} {:>10}",
        "finding", "count", "transactions", "share", "median", "p99"
    );
    for s in &an.summary {
        let _ = writeln!(
            out,
            "{:<18} {:>8} {:>14} {:>6.1}% {:>10} {:>10}",
            s.kind,
            s.findings,
            s.transactions_affected,
            s.share * 100.0,
            ms(s.median_us),
            ms(s.p99_us)
        );
    }
    if let Some(h) = &an.black_hole {
        let frames: Vec<String> = h.frames.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "PMTU black hole: {}, the first at {:.6} s; e.g. stream {}, frames {}",
            h.what(),
            h.first_us as f64 / 1e6,
            h.stream,
            frames.join(",")
        );
    }
    let shown: Vec<_> = if verbose {
        an.findings.iter().collect()
    } else {
        // One example per kind.
        let mut seen = Vec::new();
        an.findings
            .iter()
            .filter(|f| {
                if seen.contains(&f.kind) {
                    false
                } else {
                    seen.push(f.kind);
                    true
                }
            })
            .collect()
    };
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}",
        if verbose {
            "findings:"
        } else {
            "first finding of each kind (-v for all):"
        }
    );
    for f in shown {
        let frames: Vec<String> = f.frames.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "  {} stream {}{} at {:.6} s, +{}, frames {}: {}",
            f.kind,
            f.stream,
            f.transaction
                .map(|t| format!(" txn {t}"))
                .unwrap_or_default(),
            f.start_us as f64 / 1e6,
            ms(f.cost_us),
            frames.join(","),
            f.explanation
        );
    }
}

fn render_flow(out: &mut String, an: &Analysis, n: u32) {
    let s = an.streams.get(n as usize);
    let (a, b) = match s {
        Some(s) => (s.a.to_string(), s.b.to_string()),
        None => (String::new(), String::new()),
    };
    let _ = writeln!(out, "A = {a}   B = {b}");
    let _ = writeln!(
        out,
        "{:>7} {:>12} {:>10}  {:^5}  {:<14} {:>10} {:>10} {:>6}  marks",
        "frame", "time", "gap", "dir", "flags", "seq", "ack", "len"
    );
    for p in &an.stream_packets {
        let stall = p.gap_us >= 10_000;
        let _ = writeln!(
            out,
            "{:>7} {:>12.6} {:>10}  {:^5}  {:<14} {:>10} {:>10} {:>6}  {}{}",
            p.frame,
            p.time_us as f64 / 1e6,
            ms(p.gap_us),
            if p.a_to_b { "A->B" } else { "A<-B" },
            flags_str(p.flags),
            p.seq,
            p.ack,
            p.len,
            if stall { "<< gap " } else { "" },
            p.marks
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

fn render_follow(out: &mut String, an: &Analysis, n: u32) {
    let Some(s) = an.streams.get(n as usize) else {
        return;
    };
    let _ = writeln!(out, "Follow: tcp,ascii  stream {n}  {} <-> {}", s.a, s.b);
    // Reassemble each direction in sequence order, dropping retransmitted bytes.
    let mut next: BTreeMap<bool, u32> = BTreeMap::new();
    for p in &an.stream_packets {
        if p.len == 0 {
            continue;
        }
        let n = next.entry(p.a_to_b).or_insert(p.seq);
        let skip = n.wrapping_sub(p.seq) as i32;
        if skip < 0 {
            // A hole: bytes not captured.
            let _ = writeln!(out, "[{} bytes missing]", -skip);
        }
        let skip = usize::try_from(skip.max(0)).unwrap_or(0);
        if skip >= p.len as usize {
            continue;
        }
        let data = p.payload.get(skip..).unwrap_or(&[]);
        let text: String = data
            .iter()
            .map(|&c| {
                if c == b'\n' || c == b'\r' || c == b'\t' || (0x20..0x7f).contains(&c) {
                    c as char
                } else {
                    '.'
                }
            })
            .collect();
        if !p.a_to_b {
            out.push('\t');
        }
        out.push_str(&text.replace('\n', if p.a_to_b { "\n" } else { "\n\t" }));
        let cut = p.len as usize - skip - data.len();
        if cut > 0 {
            let _ = write!(out, "[{cut} bytes not captured]");
        }
        out.push('\n');
        *n = p.seq.wrapping_add(p.len);
    }
    let _ = writeln!(
        out,
        "==================================================================="
    );
}

/// Writes the capture back as pcapng with a comment on every frame a finding involves.
fn annotate(
    input: &std::path::Path,
    output: &std::path::Path,
    an: &Analysis,
) -> anyhow::Result<()> {
    let mut comments: BTreeMap<u64, String> = BTreeMap::new();
    for f in &an.findings {
        let text = format!(
            "lagtrace: {}{} (stream {}, +{}): {}",
            f.kind,
            f.detail
                .as_deref()
                .map(|d| format!("/{d}"))
                .unwrap_or_default(),
            f.stream,
            ms(f.cost_us),
            f.explanation
        );
        for fr in &f.frames {
            let c = comments.entry(*fr).or_default();
            if !c.is_empty() {
                c.push_str(" | ");
            }
            c.push_str(&text);
        }
    }
    let stats = lagtrace_packet::annotate::write_annotated(input, output, &comments)
        .with_context(|| format!("annotate {}", output.display()))?;
    eprintln!(
        "lagtrace analyze: wrote {} ({} frames, {} with a finding comment)",
        output.display(),
        stats.frames,
        stats.commented
    );
    Ok(())
}
