// Shared by the build scripts that compile a BPF program with clang (crates/host,
// crates/sockets), included with `include!`: finding the tools, running them with a
// one-line error, and telling the crate whether its program was built.

/// The tool named by env `env`, else `name` from /usr/sbin or /sbin (bpftool lives there,
/// often not on a user's PATH), else `name` on the PATH.
fn tool(env: &str, name: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return p.into();
    }
    for dir in ["/usr/sbin", "/sbin"] {
        let p = std::path::Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    name.into()
}

/// Runs `cmd`; its stdout, or a one-line error (the first line of stderr naming an error).
fn run(cmd: &mut std::process::Command) -> Result<Vec<u8>, String> {
    let what = format!("{:?}", cmd.get_program());
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
        return Err(format!("{what} failed ({}): {first}", out.status));
    }
    Ok(out.stdout)
}

/// The build script's `main`: reruns on `src` and the environment in `envs`, builds with
/// `build(OUT_DIR)` unless LAGTRACE_NO_BPF is set, and tells the crate the outcome: cfg
/// `lagtrace_bpf` and `LAGTRACE_BPF_BUILD` = `built` or `not built: WHY`.
fn bpf_main(src: &str, envs: &[&str], build: fn(&std::path::Path) -> Result<(), String>) {
    println!("cargo::rerun-if-changed={src}");
    for e in ["LAGTRACE_NO_BPF", "CLANG"].iter().chain(envs) {
        println!("cargo::rerun-if-env-changed={e}");
    }
    println!("cargo::rustc-check-cfg=cfg(lagtrace_bpf)");
    let built = if std::env::var_os("LAGTRACE_NO_BPF").is_some() {
        Err("LAGTRACE_NO_BPF was set".to_string())
    } else {
        match std::env::var_os("OUT_DIR") {
            Some(out) => build(std::path::Path::new(&out)),
            None => Err("no OUT_DIR".into()),
        }
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
