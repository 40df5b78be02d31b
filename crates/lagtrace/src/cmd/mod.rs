//! One module per subcommand: each has `Args` (clap) and `run(Args) -> Result<ExitCode>`.
//! Commands validate their flags, call the engine crates, and hand the result to a renderer.

use std::process::ExitCode;

pub mod agent;
pub mod analyze;
pub mod capture;
pub mod demo;
pub mod diagnose;
pub mod habits;
pub mod host;
pub mod lab;
pub mod load;
pub mod ping;
pub mod route;
pub mod serve;
pub mod shell;
pub mod sockets;

/// Exit status when the command ran and found a problem.
pub const EXIT_FINDING: u8 = 1;
/// Exit status when the command could not run.
pub const EXIT_ERROR: u8 = 2;

/// A duration flag that must be above zero (`--timeout 0` would fail every request and
/// call that a measurement).
pub fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = lagtrace_load::parse_duration(s).map_err(|e| format!("{e:#}"))?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} is zero: give a positive duration (e.g. 2s, 500ms)"
        ));
    }
    Ok(d)
}

/// A process id flag: a running process, checked before any work.
pub fn process_id(s: &str) -> Result<u32, String> {
    let pid: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a process id"))?;
    if pid == 0 {
        return Err("0 is not a process id".into());
    }
    if !std::path::Path::new("/proc").join(pid.to_string()).exists() {
        return Err(format!("no process {pid} (not in /proc)"));
    }
    Ok(pid)
}

/// Checks, before the run, that an output file can be written: its directory exists and
/// the file can be opened for writing (a file this check creates is removed again).
pub fn check_output(flag: &str, p: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .with_context(|| format!("{flag} {}: cannot be written", p.display()))?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Prints an error as one line (`lagtrace: error: outer: inner: ...`) and returns exit 2.
/// A broken pipe (output piped into `head`) is not an error.
pub fn report_error(err: &anyhow::Error) -> ExitCode {
    if err
        .chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    {
        return ExitCode::SUCCESS;
    }
    eprintln!("lagtrace: error: {err:#}");
    ExitCode::from(EXIT_ERROR)
}
