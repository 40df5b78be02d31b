//! Builds the socket-call recorder (bpf/record.bpf.c) with clang, CO-RE against the build
//! machine's kernel BTF (`bpftool btf dump`); the same steps as crates/host/build.rs. Without
//! clang, bpftool or BTF the crate still builds: `--record` then uses seccomp + ptrace and
//! says why (`LAGTRACE_BPF_BUILD`).

use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "bpf/record.bpf.c";
const BTF: &str = "/sys/kernel/btf/vmlinux";

fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return p.into();
    }
    // bpftool lives in /usr/sbin, often not on a user's PATH.
    for dir in ["/usr/sbin", "/sbin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    name.into()
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
    println!("cargo::rerun-if-changed={SRC}");
    println!("cargo::rerun-if-env-changed=LAGTRACE_NO_BPF");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=BPFTOOL");
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
