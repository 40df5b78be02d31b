//! `lagtrace sockets`.

use std::process::ExitCode;

pub type Args = super::Pending;

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    super::not_built("sockets", 6)
}
