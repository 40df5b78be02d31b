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
    /// The page of this subcommand (`lagtrace-SUBCOMMAND(1)`; `load merge` for a nested one);
    /// default: `lagtrace(1)`
    pub subcommand: Vec<String>,
    /// Write every page (lagtrace.1 and lagtrace-SUBCOMMAND.1) into DIR instead
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub dir: Option<PathBuf>,
}

/// Writes the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "lagtrace", &mut out);
    let script = netns_names(a.shell, &String::from_utf8_lossy(&out));
    std::io::stdout().lock().write_all(script.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// `--netns` completes the names `ip netns list` prints, not file names (clap_complete knows
/// no such value; its bash, zsh and fish lines for the flag are rewritten).
fn netns_names(shell: clap_complete::Shell, script: &str) -> String {
    use clap_complete::Shell;
    let mut out = String::with_capacity(script.len() + 1024);
    let mut after_netns = false;
    for line in script.lines() {
        let t = line.trim();
        let line = match shell {
            Shell::Bash if after_netns => line.replace(
                "compgen -f \"${cur}\"",
                "compgen -W \"$(ip netns list 2>/dev/null | cut -d' ' -f1)\" -- \"${cur}\"",
            ),
            Shell::Zsh if t.contains("--netns=[") => line.replace(
                ":_default'",
                ":{compadd -- $(ip netns list 2>/dev/null | cut -d\" \" -f1)}'",
            ),
            Shell::Fish if t.contains(" -l netns ") && t.ends_with(" -r") => {
                format!("{line} -f -a \"(ip netns list 2>/dev/null | string split -f1 ' ')\"")
            }
            _ => line.to_string(),
        };
        after_netns = t == "--netns)";
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Writes one manual page to stdout, or all of them into `--dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    // No page for clap's `help` subcommands: `help` is not a command a reader looks up.
    let mut cmd = without_help(cmd);
    cmd.build();
    if let Some(dir) = a.dir {
        let mut pages = Vec::new();
        pages_of(&cmd, "lagtrace", &mut pages);
        for (name, page) in pages {
            let path = dir.join(format!("{name}.1"));
            let mut out = Vec::new();
            clap_mangen::Man::new(page).render(&mut out)?;
            std::fs::write(&path, out)
                .with_context(|| format!("writing manual pages into {}", dir.display()))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut page = cmd;
    let mut full = String::from("lagtrace");
    for word in &a.subcommand {
        let Some(sub) = page.find_subcommand(word).cloned() else {
            let names: Vec<&str> = page.get_subcommands().map(|s| s.get_name()).collect();
            let of = full.replace('-', " ");
            bail!(
                "no subcommand {word:?} of {of} (one of: {})",
                names.join(", ")
            );
        };
        full = format!("{full}-{}", sub.get_name());
        page = sub.name(full.clone()).bin_name(full.clone());
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn without_help(cmd: clap::Command) -> clap::Command {
    cmd.disable_help_subcommand(true)
        .mut_subcommands(without_help)
}

/// Every page of `cmd` and its subcommands, named `lagtrace-SUB[-SUB]`.
fn pages_of(cmd: &clap::Command, name: &str, out: &mut Vec<(String, clap::Command)>) {
    out.push((
        name.to_string(),
        cmd.clone()
            .name(name.to_string())
            .bin_name(name.to_string()),
    ));
    for sub in cmd.get_subcommands() {
        pages_of(sub, &format!("{name}-{}", sub.get_name()), out);
    }
}
