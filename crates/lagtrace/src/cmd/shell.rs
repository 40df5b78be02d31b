//! `lagtrace completions SHELL` and `lagtrace man`: generated from the same clap definition
//! the parser uses, so they never drift from the flags.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

/// Shell completions, written to stdout.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace completions bash > /etc/bash_completion.d/lagtrace
  lagtrace completions zsh > \"${fpath[1]}/_lagtrace\"
  lagtrace completions fish > ~/.config/fish/completions/lagtrace.fish")]
pub struct CompletionsArgs {
    /// The shell to complete for
    pub shell: clap_complete::Shell,
}

/// Manual pages (roff), from the same definitions as --help.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  lagtrace man | man -l -
  lagtrace man diagnose > lagtrace-diagnose.1
  lagtrace man --dir /usr/local/share/man/man1")]
pub struct ManArgs {
    /// The page of this subcommand (`lagtrace-SUBCOMMAND(1)`); default: `lagtrace(1)`
    pub subcommand: Option<String>,
    /// Write every page (lagtrace.1 and lagtrace-SUBCOMMAND.1) into DIR instead
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub dir: Option<PathBuf>,
}

/// Writes the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "lagtrace", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes one manual page to stdout, or all of them into `--dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut cmd = cmd;
    cmd.build();
    if let Some(dir) = a.dir {
        clap_mangen::generate_to(cmd, &dir)
            .with_context(|| format!("writing manual pages into {}", dir.display()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let page = match a.subcommand.as_deref() {
        None => cmd,
        Some(name) => {
            let Some(sub) = cmd.find_subcommand(name) else {
                let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
                bail!("no subcommand {name:?} (one of: {})", names.join(", "));
            };
            let full = format!("lagtrace-{}", sub.get_name());
            sub.clone().name(full.clone()).bin_name(full)
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}
