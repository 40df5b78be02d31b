//! Builds the socket-call recorder (bpf/record.bpf.c) with clang against the UAPI and libbpf
//! headers (linux-libc-dev, libbpf-dev); it needs no kernel BTF at build time (no CO-RE: the
//! loader finds the hooked functions in the running kernel's BTF and checks the tracepoint
//! records against tracefs). Without clang or the headers the crate still builds:
//! `--record` then uses seccomp + ptrace and says why (`LAGTRACE_BPF_BUILD`).

use std::path::Path;
use std::process::Command;

include!("../../support/bpf_build.rs");

const SRC: &str = "bpf/record.bpf.c";

fn build(out: &Path) -> Result<(), String> {
    // <linux/types.h> includes <asm/types.h>, under the target's multiarch directory, which
    // clang does not search for `-target bpf`.
    let multiarch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        Ok(a) => return Err(format!("no multiarch include directory known for {a}")),
        Err(_) => return Err("no target arch".into()),
    };
    let obj = out.join("record.bpf.o");
    run(Command::new(tool("CLANG", "clang"))
        .args(["-target", "bpf", "-O2", "-g", "-Wall"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", SRC, "-o"])
        .arg(&obj))?;
    // DWARF is not needed (BTF is kept); best effort.
    let _ = run(Command::new("llvm-strip").arg("-g").arg(&obj));
    Ok(())
}

fn main() {
    bpf_main(SRC, &[], build);
}
