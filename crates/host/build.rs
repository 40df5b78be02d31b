//! Builds the per-namespace drop counter (bpf/drops.bpf.c) with clang against the UAPI and
//! libbpf headers (linux-libc-dev, libbpf-dev); it needs no kernel BTF at build time (the
//! loader reads the struct offsets from the running kernel's). Without clang or the headers
//! the crate still builds: the drop layer then counts machine-wide (perf) and says why at
//! run time (`LAGTRACE_BPF_BUILD`).

use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "bpf/drops.bpf.c";

fn tool(env: &str, name: &str) -> PathBuf {
    std::env::var_os(env).map_or_else(|| name.into(), Into::into)
}

fn run(cmd: &mut Command) -> Result<Vec<u8>, String> {
    let what = format!("{:?}", cmd.get_program());
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
        return Err(format!("{what} failed ({}): {first}", out.status));
    }
    Ok(out.stdout)
}

fn build(out: &Path) -> Result<(), String> {
    if std::env::var_os("LAGTRACE_NO_BPF").is_some() {
        return Err("LAGTRACE_NO_BPF was set".into());
    }
    // <linux/types.h> includes <asm/types.h>, under the target's multiarch directory, which
    // clang does not search for `-target bpf`.
    let multiarch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        Ok(a) => return Err(format!("no multiarch include directory known for {a}")),
        Err(_) => return Err("no target arch".into()),
    };
    let obj = out.join("drops.bpf.o");
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
    println!("cargo::rerun-if-changed={SRC}");
    println!("cargo::rerun-if-env-changed=LAGTRACE_NO_BPF");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rustc-check-cfg=cfg(lagtrace_bpf)");
    let built = match std::env::var_os("OUT_DIR") {
        Some(out) => build(&PathBuf::from(out)),
        None => Err("no OUT_DIR".into()),
    };
    match built {
        Ok(()) => {
            println!("cargo::rustc-cfg=lagtrace_bpf");
            println!("cargo::rustc-env=LAGTRACE_BPF_BUILD=built");
        }
        Err(e) => {
            let e = e.replace(['\n', '\r'], " ");
            println!("cargo::rustc-env=LAGTRACE_BPF_BUILD=not built: {e}");
        }
    }
}
