//! Builds the per-namespace drop counter (bpf/drops.bpf.c), the off-CPU tracer
//! (bpf/offcpu.bpf.c), the on-CPU sampler (bpf/oncpu.bpf.c) and the softirq timer
//! (bpf/softirq.bpf.c) with clang against the UAPI and libbpf headers (linux-libc-dev,
//! libbpf-dev); it needs no kernel BTF at build time (the loader reads the struct offsets
//! from the running kernel's). Without clang or the headers
//! the crate still builds: the drop layer then counts machine-wide (perf) and says why at
//! run time (`LAGTRACE_BPF_BUILD`).

use std::path::Path;
use std::process::Command;

include!("../../support/bpf_build.rs");

const SRC: &str = "bpf/drops.bpf.c";
const OFFCPU: &str = "bpf/offcpu.bpf.c";
const SOFTIRQ: &str = "bpf/softirq.bpf.c";
const ONCPU: &str = "bpf/oncpu.bpf.c";

fn build(out: &Path) -> Result<(), String> {
    // <linux/types.h> includes <asm/types.h>, under the target's multiarch directory, which
    // clang does not search for `-target bpf`.
    let multiarch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        Ok(a) => return Err(format!("no multiarch include directory known for {a}")),
        Err(_) => return Err("no target arch".into()),
    };
    for (src, name) in [
        (SRC, "drops.bpf.o"),
        (OFFCPU, "offcpu.bpf.o"),
        (SOFTIRQ, "softirq.bpf.o"),
        (ONCPU, "oncpu.bpf.o"),
    ] {
        let obj = out.join(name);
        run(Command::new(tool("CLANG", "clang"))
            .args(["-target", "bpf", "-O2", "-g", "-Wall"])
            .arg(format!("-I/usr/include/{multiarch}"))
            .args(["-c", src, "-o"])
            .arg(&obj))?;
        // DWARF is not needed (BTF is kept); best effort.
        let _ = run(Command::new("llvm-strip").arg("-g").arg(&obj));
    }
    Ok(())
}

fn main() {
    println!("cargo::rerun-if-changed={OFFCPU}");
    println!("cargo::rerun-if-changed={SOFTIRQ}");
    println!("cargo::rerun-if-changed={ONCPU}");
    bpf_main(SRC, &[], build);
}
