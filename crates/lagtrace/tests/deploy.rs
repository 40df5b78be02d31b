//! `deploy/`: the container image's root filesystem holds a binary that runs alone (chrooted
//! into it: no host library is reachable), and the Kubernetes manifests validate offline
//! against the Kubernetes schemas (`kubernetes-validate`, installed by .ci/setup) and ask for
//! what the issue says: an Indexed Job of N = N workers writing their logs with the index as
//! the worker id, and a DaemonSet for the agent with exactly its capabilities.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lagtrace_testkit::server::{Mode, TestServer};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifests() -> Vec<PathBuf> {
    let dir = repo().join("deploy/kubernetes");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 2, "{v:?}");
    v
}

/// `kubernetes-validate` on PATH, or where .ci/setup installs it.
fn validator() -> PathBuf {
    let installed = PathBuf::from("/opt/lagtrace-tools/venv/bin/kubernetes-validate");
    if installed.exists() {
        return installed;
    }
    let o = Command::new("sh")
        .args(["-c", "command -v kubernetes-validate"])
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        !p.is_empty(),
        "kubernetes-validate is not installed (bash .ci/setup installs it)"
    );
    PathBuf::from(p)
}

/// The manifest's documents as JSON (PyYAML from the validator's own environment).
fn yaml_docs(p: &Path) -> Vec<Value> {
    let python = validator().with_file_name("python3");
    let python = if python.exists() {
        python
    } else {
        PathBuf::from("python3")
    };
    let o = Command::new(python)
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Runs the validator with no network (its own namespace: nothing to reach).
fn validate_offline(files: &[PathBuf]) -> Output {
    Command::new("unshare")
        .arg("-n")
        .arg(validator())
        .arg("--strict")
        .args(files)
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs root"]
fn manifests_validate_offline_and_a_broken_one_does_not() {
    let o = validate_offline(&manifests());
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches(" passed ").count(), 2, "{out}");
    // The check can fail: a field of the wrong type, and one Kubernetes does not know.
    let dir = tempfile::tempdir().unwrap();
    let job = std::fs::read_to_string(repo().join("deploy/kubernetes/load-job.yaml")).unwrap();
    for (from, to) in [
        ("parallelism: 3", "parallelism: three"),
        ("completionMode: Indexed", "completionsMode: Indexed"),
    ] {
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, job.replace(from, to)).unwrap();
        let o = validate_offline(&[bad]);
        assert!(!o.status.success(), "{to}: {o:?}");
    }
}

fn help(cmd: &str) -> String {
    let o = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every `--flag` of `args` is one the command has.
fn assert_flags_exist(cmd: &str, args: &[Value]) {
    let h = help(cmd);
    for a in args.iter().filter_map(Value::as_str) {
        if let Some(flag) = a.strip_prefix("--") {
            let name = flag.split('=').next().unwrap();
            assert!(h.contains(&format!("--{name}")), "{cmd}: no --{name}");
        }
    }
}

#[test]
fn manifests_ask_for_indexed_workers_and_the_agents_capabilities() {
    let ms = manifests();
    let ds = &yaml_docs(&ms[0])[0];
    let job = &yaml_docs(&ms[1])[0];
    assert_eq!(job["kind"], "Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], spec["parallelism"]);
    let c = &spec["template"]["spec"]["containers"][0];
    let args = c["args"].as_array().unwrap();
    assert_eq!(args[0], "load");
    for want in [
        "--worker-id=w$(JOB_COMPLETION_INDEX)",
        "--hdr-log=-",
        "--start-at=$(START_AT)",
    ] {
        assert!(args.iter().any(|a| a == want), "{want}: {args:?}");
    }
    assert!(
        args.iter().any(|a| a.as_str().unwrap().starts_with("-d")),
        "bounded: {args:?}"
    );
    assert_flags_exist("load", args);

    assert_eq!(ds["kind"], "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true);
    let c = &pod["containers"][0];
    let caps = &c["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    let mut add: Vec<&str> = caps["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    add.sort_unstable();
    assert_eq!(
        add,
        ["BPF", "NET_RAW", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"]
    );
    assert_ne!(c["securityContext"]["privileged"], true);
    let args = c["args"].as_array().unwrap();
    assert_eq!(args[0], "agent");
    assert_flags_exist("agent", args);
    // The token is a file from a Secret volume, never a flag's value or an env var.
    let token = args
        .iter()
        .find_map(|a| a.as_str().unwrap().strip_prefix("--token-file="))
        .expect("--token-file");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| token.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("the token file is on a mount");
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(vol["secret"]["secretName"].is_string(), "{vol}");
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "LAGTRACE_AGENT_TOKEN")
    );
}

#[test]
#[ignore = "needs root"]
fn rootfs_tarball_runs_the_binary_alone() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("rootfs.tar");
    let o = Command::new("bash")
        .arg(repo().join("deploy/image/build-rootfs.sh"))
        .arg(BIN)
        .arg(&tar)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let x = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap();
    assert!(x.success());
    assert!(root.join("usr/bin/lagtrace").exists());
    // Nothing but the binary, its libraries and a few files of /etc.
    let n = walk(&root);
    assert!(n < 40, "{n} files");
    // Chrooted: only the tree's libraries can load. A real load against a server here
    // (the chroot shares the network), its log, and the merge of it, all inside.
    let srv = TestServer::spawn(Mode::ok());
    let chroot = |args: &[&str]| -> Output {
        Command::new("chroot")
            .arg(&root)
            .arg("/usr/bin/lagtrace")
            .args(args)
            .output()
            .unwrap()
    };
    let o = chroot(&[
        "load",
        "-n",
        "50",
        "-c1",
        "-t1",
        "--hdr-log",
        "/tmp/w.hlog",
        &srv.url(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let o = chroot(&["load", "merge", "--json", "/tmp/w.hlog"]);
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["requests"], 50);
    build_with_podman(&tar);
}

/// The Containerfile turns the tarball into an image (podman, installed by .ci/setup): its
/// entrypoint is the binary, its user nobody, its one layer the tarball's files. (Running a
/// container needs cgroups and rlimits a CI sandbox may not grant; the chroot run above is
/// what shows the tree is complete.)
fn build_with_podman(tar: &Path) {
    let ctx = tempfile::tempdir().unwrap();
    std::fs::copy(tar, ctx.path().join("lagtrace-rootfs.tar")).unwrap();
    let tag = format!("localhost/lagtrace-test:{}", std::process::id());
    let o = Command::new("podman")
        .args(["build", "-q", "-t", &tag, "-f"])
        .arg(repo().join("deploy/image/Containerfile"))
        .arg(ctx.path())
        .output()
        .expect("podman (bash .ci/setup installs it)");
    let inspect = Command::new("podman")
        .args(["image", "inspect", &tag])
        .output()
        .unwrap();
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
    assert!(o.status.success(), "{o:?}");
    assert!(inspect.status.success(), "{inspect:?}");
    let v: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let cfg = &v[0]["Config"];
    assert_eq!(cfg["Entrypoint"], serde_json::json!(["/usr/bin/lagtrace"]));
    assert_eq!(cfg["User"], "65534:65534");
    assert_eq!(v[0]["RootFS"]["Layers"].as_array().unwrap().len(), 1);
}

fn walk(p: &Path) -> usize {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(&e.path())
            } else {
                1
            }
        })
        .sum()
}
