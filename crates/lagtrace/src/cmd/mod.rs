//! One module per subcommand: each has `Args` (clap) and `run(Args) -> Result<ExitCode>`.
//! Commands validate their flags, call the engine crates, and hand the result to a renderer.

use std::process::ExitCode;

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
