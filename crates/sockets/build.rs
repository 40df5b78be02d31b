//! Builds the socket-call recorder (bpf/record.bpf.c) with clang, CO-RE against the build
//! machine's kernel BTF (`bpftool btf dump`); the same steps as crates/host/build.rs. Without
//! clang, bpftool or BTF the crate still builds: `--record` then uses seccomp + ptrace and
//! says why (`LAGTRACE_BPF_BUILD`).

use std::path::Path;
use std::process::Command;

include!("../../support/bpf_build.rs");

const SRC: &str = "bpf/record.bpf.c";
const BTF: &str = "/sys/kernel/btf/vmlinux";

fn build(out: &Path) -> Result<(), String> {
    if !Path::new(BTF).exists() {
        return Err(format!("no kernel BTF at {BTF} on the build machine"));
    }
    let header =
        run(Command::new(tool("BPFTOOL", "bpftool"))
            .args(["btf", "dump", "file", BTF, "format", "c"]))?;
    std::fs::write(out.join("vmlinux.h"), header).map_err(|e| e.to_string())?;
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(a) => return Err(format!("no BPF target arch for {a}")),
        Err(_) => return Err("no target arch".into()),
    };
    let obj = out.join("record.bpf.o");
    run(Command::new(tool("CLANG", "clang"))
        .args(["-target", "bpf", "-O2", "-g", "-Wall"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg("-I")
        .arg(out)
        .args(["-c", SRC, "-o"])
        .arg(&obj))?;
    // DWARF is not needed (BTF is kept); best effort.
    let _ = run(Command::new("llvm-strip").arg("-g").arg(&obj));
    Ok(())
}

fn main() {
    bpf_main(SRC, &["BPFTOOL"], build);
}
